//! `make validate` on `template.yaml`, and proof that it catches what `cfn-lint` alone or
//! `sam validate --lint` miss: each broken copy of the template must fail it.

#[path = "common/temp_file.rs"]
mod temp_file;

use std::path::{Path, PathBuf};
use std::process::Command;

use temp_file::TempFile;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `scripts/validate-template` on `template`; returns whether it passed and what it said.
fn validate(template: &Path) -> (bool, String) {
    let output = Command::new(root().join("scripts/validate-template"))
        .arg(template)
        .current_dir(root())
        .output()
        .expect("scripts/validate-template runs; `make venv` installs its tools");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

/// A copy of `template.yaml` with `from` replaced by `to` (which must occur), removed when the
/// test ends.
fn broken(name: &str, from: &str, to: &str) -> TempFile {
    let template = std::fs::read_to_string(root().join("template.yaml")).unwrap();
    assert!(
        template.contains(from),
        "the template no longer holds {from:?}"
    );
    TempFile::write(
        &format!("kc-template-{}-{name}.yaml", std::process::id()),
        template.replacen(from, to, 1),
    )
}

#[test]
fn the_template_passes_validation() {
    let (passed, said) = validate(&root().join("template.yaml"));
    assert!(passed, "{said}");
}

#[test]
fn a_misspelled_event_property_fails_validation() {
    let path = broken(
        "misspelled",
        "MaximumBatchingWindowInSeconds: 1",
        "MaximumBatchingWindowInSecond: 1",
    );
    let (passed, said) = validate(&path);
    assert!(!passed);
    assert!(said.contains("MaximumBatchingWindowInSecond"), "{said}");
}

#[test]
fn an_out_of_range_batch_size_fails_validation() {
    let path = broken("batch-size", "BatchSize: 100\n", "BatchSize: 100000\n");
    let (passed, said) = validate(&path);
    assert!(!passed);
    assert!(
        said.contains("100000 is greater than the maximum of 10000"),
        "{said}"
    );
}

#[test]
fn a_reference_to_a_missing_resource_fails_validation() {
    let path = broken(
        "missing-resource",
        "Resource: !GetAtt LedgerTable.Arn",
        "Resource: !GetAtt LedgerTabel.Arn",
    );
    let (passed, said) = validate(&path);
    assert!(!passed);
    assert!(said.contains("LedgerTabel"), "{said}");
}

#[test]
fn every_examples_template_passes_validation() {
    let mut templates: Vec<PathBuf> = std::fs::read_dir(root().join("examples"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("template.yaml"))
        .filter(|template| template.exists())
        .collect();
    templates.sort();
    assert!(templates.len() >= 7, "{templates:?}");
    for template in templates {
        let (passed, said) = validate(&template);
        assert!(passed, "{}: {said}", template.display());
    }
}
