"""Custom resources checked as the API server checks them: against the real CRDs' schemas and their CEL rules.

The CustomResourceDefinitions lie in ``../shared/reference/crds/`` beside the checkout (read there, never copied into
it); a missing directory fails the test that needs it. The server validates a custom resource against its version's
``openAPIV3Schema``, a structural schema in OpenAPI v3's dialect, and :func:`json_schema` turns that into a JSON
Schema for the ``jsonschema`` package, read as the server reads it:

- a field the schema does not name is an error, except under ``x-kubernetes-preserve-unknown-fields``: the server
  would prune it without a word, which for a manifest of ours is a bug;
- ``x-kubernetes-int-or-string`` admits an integer or a string; ``nullable`` admits null, and nothing else does;
- the formats the server checks and the CRDs use, ``duration`` and ``date-time``, are checked; ``int32`` and
  ``int64`` are hints it ignores; ``x-kubernetes-list-type`` ``set`` and ``map`` admit no duplicate item or key;
- defaults are filled in first (:func:`with_defaults`), as the server does before it validates;
- the root's ``metadata`` is Kubernetes' own ObjectMeta, from the schemas kubernetes-validate ships.

The CEL rules (``x-kubernetes-validations``) are evaluated by ``cel`` (common-expression-language), with ``self``
bound as Kubernetes binds it (:func:`cel_value`): an object of declared fields with their names escaped (``namespace``
is ``__namespace__``), a map as a map, ``duration`` and ``date-time`` strings as durations and timestamps, an
int-or-string as whichever it holds (``self != 0`` on a port name is true: CEL's heterogeneous equality, which
cel-python lacks). Transition rules, those that read ``oldSelf``, are left out: the server evaluates them only when
an object is updated, and applying a manifest creates it. A rule that cannot be evaluated (one calling a function of
Kubernetes' own CEL library, ``isURL``, which ``cel`` does not have) is an error, never a pass.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cel
import jsonschema
import pytest
import yaml
from kubernetes_validate.utils import latest_version, schema_contents
from referencing import Registry, Resource

CRDS = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "crds"

# ObjectMeta in the definitions kubernetes-validate ships, by their $id.
_K8S_DEFINITIONS = "https://kubernetes.io/api/_definitions.json"
OBJECT_META = {"$ref": f"{_K8S_DEFINITIONS}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}

# The keywords JSON Schema reads as OpenAPI does; `default` for with_defaults; the x-kubernetes-* for the checks below.
_KEPT = (
    "enum", "pattern", "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems",
    "minProperties", "maxProperties", "multipleOf", "required", "format", "default",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-validations",
)  # fmt: skip


def crds(directory: Path = CRDS) -> dict[tuple[str, str], dict[str, Any]]:
    """Each (apiVersion, kind) the CRDs in ``directory`` define -> its openAPIV3Schema."""
    if not directory.is_dir() or not any(directory.glob("*.yaml")):
        pytest.fail(
            f"no CRDs at {directory}: the tests read the real CustomResourceDefinitions from shared/reference/crds/ "
            "beside the checkout (CI lays shared/ there)"
        )
    return _load(directory)


@functools.cache
def _load(directory: Path) -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in sorted(directory.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            found[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return found


def is_custom(document: dict[str, Any]) -> bool:
    """Whether a CRD in ../shared/reference/crds defines the document's kind."""
    return (document["apiVersion"], document["kind"]) in crds()


def errors(document: dict[str, Any]) -> list[str]:
    """What the API server would refuse in ``document``, a custom resource, each as ``path: why``."""
    key = (document["apiVersion"], document["kind"])
    if key not in crds():
        pytest.fail(f"no CRD for {key[1]} of {key[0]} in {CRDS}")
    validator = _validator(*key)
    found = validator.iter_errors(with_defaults(document, validator.schema))
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in found)


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    schema = json_schema(crds()[(api_version, kind)])
    schema["properties"]["metadata"] = OBJECT_META  # the CRD says `type: object`; the server reads ObjectMeta
    return Validator(schema, registry=_registry(), format_checker=FORMATS)


@functools.cache
def _registry() -> Registry:
    version = latest_version()
    definitions = schema_contents(f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version)
    return Resource.from_contents(definitions) @ Registry()


def json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """A structural schema node (OpenAPI v3, as in a CRD) as JSON Schema, with the API server's reading of it."""
    out = {keyword: node[keyword] for keyword in _KEPT if keyword in node}
    types = (
        ["integer", "string"] if node.get("x-kubernetes-int-or-string") else [node["type"]] if "type" in node else []
    )
    if types and node.get("nullable"):
        types.append("null")
    if types:
        out["type"] = types if len(types) > 1 else types[0]
    # OpenAPI v3.0's exclusive bounds are flags on minimum and maximum; JSON Schema's are the bounds themselves.
    for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if node.get(flag):
            out[flag] = out.pop(bound)
    if "properties" in node:
        out["properties"] = {name: json_schema(field) for name, field in node["properties"].items()}
    if "items" in node:
        out["items"] = json_schema(node["items"])
    for combinator in ("allOf", "anyOf", "oneOf"):
        if combinator in node:
            out[combinator] = [json_schema(branch) for branch in node[combinator]]
    if "not" in node:
        out["not"] = json_schema(node["not"])
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = json_schema(extra)  # a map: any key, each value of this schema
    elif extra is not None:
        out["additionalProperties"] = extra
    elif node.get("type") == "object" and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False  # the server prunes what the schema does not name
    return out


def with_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """``value`` with the schema's defaults filled in where a field is absent, as the server does before validating."""
    if isinstance(value, dict):
        fields, extra = schema.get("properties", {}), schema.get("additionalProperties")
        out = {k: with_defaults(v, fields.get(k, extra if isinstance(extra, dict) else {})) for k, v in value.items()}
        for name, field in fields.items():
            if name not in out and "default" in field:
                out[name] = with_defaults(copy.deepcopy(field["default"]), field)
        return out
    if isinstance(value, list):
        return [with_defaults(item, schema.get("items", {})) for item in value]
    return value


# --- formats: those the server checks (kube-openapi's strfmt) that the CRDs use -------------------------------------

# Go's time.ParseDuration: "15s", "1h30m", "1.5h".
_GO_DURATION = re.compile(r"[-+]?(0|((\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h))+)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
# strfmt's fallback: a whole number and a unit, spelt short or long, up to weeks ("3d", "1 week").
_UNITS = {
    ("ns", "nanoseconds"): 1e-9, ("us", "microseconds"): 1e-6, ("ms", "milliseconds"): 1e-3, ("s", "seconds"): 1,
    ("m", "minutes"): 60, ("h", "hours"): 3600, ("d", "days"): 86400, ("w", "weeks"): 604800,
}  # fmt: skip


def parse_duration(text: str) -> datetime.timedelta | None:
    """A ``format: duration`` string as the server reads it; None where it reads none."""
    if _GO_DURATION.fullmatch(text):
        sign = -1 if text.startswith("-") else 1
        parts = re.findall(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)", text)
        return datetime.timedelta(seconds=sign * sum(float(n) * _GO_UNITS[unit] for n, unit in parts))
    seconds, matched = 0.0, False
    for number, unit in re.findall(r"(\d+)\s*([A-Za-zµ]+)", text):
        unit = unit.lower()
        for (short, long), factor in _UNITS.items():
            if unit in (short, long) or unit.startswith(long):
                seconds, matched = seconds + int(number) * factor, True
    return datetime.timedelta(seconds=seconds) if matched else None


def parse_date_time(text: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None


FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checks("duration")(lambda value: not isinstance(value, str) or parse_duration(value) is not None)
FORMATS.checks("date-time")(lambda value: not isinstance(value, str) or parse_date_time(value) is not None)


# --- the x-kubernetes-* keywords ------------------------------------------------------------------------------------


def _list_type(validator: Any, list_type: str, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    """``set``: no item twice; ``map``: no two items with the same key fields (``atomic`` says nothing)."""
    if not isinstance(instance, list) or list_type not in ("set", "map"):
        return
    names = schema.get("x-kubernetes-list-map-keys", [])
    keys = [
        json.dumps([item.get(n) for n in names] if list_type == "map" and isinstance(item, dict) else item)
        for item in instance
    ]
    if twice := sorted({key for key in keys if keys.count(key) > 1}):
        yield jsonschema.ValidationError(
            f"duplicate {'keys ' + str(names) if list_type == 'map' else 'items'}: {twice}"
        )


# CEL's reserved words: a field so named is reached as __name__ (Kubernetes' escaping of property names).
_CEL_RESERVED = frozenset({
    "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function", "if", "import",
    "let", "loop", "package", "namespace", "return", "var", "void", "while",
})  # fmt: skip


def escape(name: str) -> str:
    """A field's name as a CEL expression selects it (k8s.io/apiserver's escaping)."""
    if name in _CEL_RESERVED:
        return f"__{name}__"
    return (
        name.replace("__", "__underscores__").replace(".", "__dot__").replace("-", "__dash__").replace("/", "__slash__")
    )


def cel_value(value: Any, schema: dict[str, Any]) -> Any:
    """``value`` as Kubernetes binds it to ``self`` for a rule at a node of ``schema`` (a JSON Schema of ours)."""
    if isinstance(value, dict):
        if "properties" in schema:  # an object of declared fields
            fields = schema["properties"]
            return {escape(k): cel_value(v, fields.get(k, {})) for k, v in value.items()}
        extra = schema.get("additionalProperties")  # a map: its keys are data, not names
        return {k: cel_value(v, extra if isinstance(extra, dict) else {}) for k, v in value.items()}
    if isinstance(value, list):
        return [cel_value(item, schema.get("items", {})) for item in value]
    if isinstance(value, str):
        parsed = {"duration": parse_duration, "date-time": parse_date_time}.get(schema.get("format", ""))
        if parsed is not None and (typed := parsed(value)) is not None:
            return typed
    return value


@functools.cache
def _program(rule: str) -> Any:
    return cel.compile(rule)


def _cel_rules(validator: Any, rules: list[dict[str, Any]], instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    for rule in rules:
        program = _program(rule["rule"])
        if "oldSelf" in program.variables() and not rule.get("optionalOldSelf"):
            continue  # a transition rule: evaluated on an update only, and a manifest applied is a create
        try:
            verdict = program.execute({"self": cel_value(instance, schema)})
        except (RuntimeError, KeyError, TypeError, ValueError) as e:
            yield jsonschema.ValidationError(f"CEL rule {rule['rule']!r} could not be evaluated here: {e}")
            continue
        if verdict is not True:
            said = rule.get("message") or rule.get("messageExpression") or "(no message)"
            yield jsonschema.ValidationError(f"CEL rule {rule['rule']!r} fails: {said}")


Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    validators={"x-kubernetes-list-type": _list_type, "x-kubernetes-validations": _cel_rules},
)
