"""Transforms a SAM template into plain CloudFormation, offline, with aws-sam-translator.

Usage: python transform_sam.py TEMPLATE OUTPUT

cfn-lint alone no longer looks inside SAM resources, so the template is expanded first (the
function, its event source mapping, its role) and the result is linted. Errors the translator
finds itself (an unknown event property, for example) fail here, naming the resource.
"""
import json
import os
import sys

from samtranslator.model.exceptions import InvalidDocumentException
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


def as_packaged(template: dict) -> dict:
    """Points local CodeUri paths at S3, as `sam package` would: the translator accepts only S3
    locations, and where the code lives changes nothing that is checked here."""
    for resource in template.get("Resources", {}).values():
        properties = resource.get("Properties") or {}
        if resource.get("Type") == "AWS::Serverless::Function" and isinstance(
            properties.get("CodeUri"), str
        ) and not properties["CodeUri"].startswith("s3://"):
            properties["CodeUri"] = "s3://packaged-by-sam/code.zip"
    return template


class NoManagedPolicies:
    """The template names its role explicitly: no AWS managed policy needs looking up."""

    def load(self):
        return {}


def main(source: str, target: str) -> int:
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with open(source, encoding="utf-8") as handle:
        template = yaml_parse(handle.read())
    try:
        output = transform(as_packaged(template), {}, NoManagedPolicies())
    except InvalidDocumentException as error:
        for cause in error.causes:
            print(f"{source}: {cause.message}", file=sys.stderr)
        return 1
    with open(target, "w", encoding="utf-8") as handle:
        json.dump(output, handle, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
