"""Building blocks of our CustomResourceDefinitions, shared by every kind's module, and the
one way their YAML is written (`deploy/crds/`, generated; a unit test per kind keeps the files
equal to the code)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from elastic_gpu.api.group import GROUP


def column(name: str, kind: str, path: str, description: str, priority: int = 0
           ) -> dict[str, Any]:
    """An additionalPrinterColumn (`kubectl get`); priority 1 shows only with `-o wide`."""
    col: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path, "description": description}
    if priority:
        col["priority"] = priority
    return col


def immutable(what: str) -> list[dict[str, str]]:
    """The CEL rule that refuses any change of a field once set."""
    return [{"rule": "self == oldSelf", "message": f"{what} is immutable"}]


def conditions_schema() -> dict[str, Any]:
    """metav1.Condition, as every controller writes it."""
    return {
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "maxItems": 16,
        "items": {
            "type": "object",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": {"type": "string", "maxLength": 316},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "reason": {"type": "string", "maxLength": 1024,
                           "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                "message": {"type": "string", "maxLength": 32768},
            },
        },
    }


def crd(kind: str, plural: str, short: str, scope: str, schema: dict[str, Any],
        columns: list[dict[str, Any]], status: bool, version: str) -> dict[str, Any]:
    """A one-version CRD of our group, `kind` served and stored at `version`."""
    served: dict[str, Any] = {"name": version, "served": True, "storage": True,
                              "schema": {"openAPIV3Schema": schema},
                              "additionalPrinterColumns": columns}
    if status:
        served["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                      "shortNames": [short], "listKind": f"{kind}List"},
            "conversion": {"strategy": "None"},
            "versions": [served],
        },
    }


class _NoAliases(yaml.SafeDumper):
    """YAML without anchors: a CRD is read by people and by kubectl, never by a YAML loader
    that would benefit from them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(manifest: Mapping[str, Any]) -> str:
    return yaml.dump(dict(manifest), Dumper=_NoAliases, sort_keys=False, width=100)


def write_main(description: str, files: Mapping[str, Callable[[], str]],
               argv: Sequence[str] | None = None) -> int:
    """`python -m elastic_gpu.api.<module> [--write DIR]` for a module that generates CRDs:
    print each file's YAML (separated by `---`), or write each into DIR under its name."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", metavar="DIR", type=Path, help="write the files into DIR")
    args = parser.parse_args(None if argv is None else list(argv))
    for filename, text in files.items():
        if args.write is None:
            sys.stdout.write(text() + "---\n")
        else:
            (args.write / filename).write_text(text())
    return 0
