"""deploy/kubernetes/components/inference without a cluster (and without the endpoint picker, which
is Go and can't be built here): kubectl's kustomize renders it into an overlay, the built-in kinds
pass the Kubernetes 1.30 schemas, the InferencePool passes its CRD's schema, and every metric spec
of the shipped EndpointPickerConfig resolves, by the picker's own rules, to exactly one of the
gauges a real `forge serve` exports (tests/gateway/test_pool_metrics.py drives them with load)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.test_kubernetes import K8S_VERSION, KDIR, render

COMPONENT = KDIR / "components" / "inference"

# The spec of InferencePool inference.networking.k8s.io/v1, transcribed (descriptions and list-type
# markers left out; additionalProperties false added, so a misspelt field fails) from
# kubernetes-sigs/gateway-api-inference-extension at 84436a96 (v1.6 line),
# config/crd/bases/inference.networking.k8s.io_inferencepools.yaml.
_LABEL_VALUE = {"type": "string", "maxLength": 63, "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}
_PORT = {
    "type": "object",
    "required": ["number"],
    "additionalProperties": False,
    "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}},
}
INFERENCE_POOL_V1_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["selector", "targetPorts"],
    "additionalProperties": False,
    "properties": {
        "appProtocol": {"type": "string", "enum": ["http", "kubernetes.io/h2c"]},
        "endpointPickerRef": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "failureMode": {"type": "string", "enum": ["FailOpen", "FailClose"]},
                "group": {"type": "string", "maxLength": 253},
                "kind": {"type": "string", "minLength": 1, "maxLength": 63},
                "name": {"type": "string", "minLength": 1, "maxLength": 253},
                "port": _PORT,
            },
        },
        "selector": {
            "type": "object",
            "required": ["matchLabels"],
            "additionalProperties": False,
            "properties": {
                "matchLabels": {
                    "type": "object",
                    "minProperties": 1,
                    "maxProperties": 64,
                    "additionalProperties": _LABEL_VALUE,
                }
            },
        },
        "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "items": _PORT},
    },
}

_BUILT_IN = {"ConfigMap", "StatefulSet", "Service", "Deployment", "ServiceAccount", "Role", "RoleBinding"}


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The base with the component, the way the README tells users to add it."""
    d = tmp_path_factory.mktemp("overlay")
    (d / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{os.path.relpath(KDIR / 'base', d)}]\n"
        f"components: [{os.path.relpath(COMPONENT, d)}]\n"
    )
    return render(d)


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [x for x in docs if x["kind"] == kind and x["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}"
    return found[0]


def test_every_object_is_valid(docs: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in docs}
    assert kinds == _BUILT_IN | {"InferencePool", "HTTPRoute"}
    for doc in docs:
        if doc["kind"] in _BUILT_IN:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    pool = _one(docs, "InferencePool", "forge")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    jsonschema.validate(pool["spec"], INFERENCE_POOL_V1_SPEC)
    route = _one(docs, "HTTPRoute", "forge")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        "forge",
    )


def test_the_crd_schema_check_can_fail() -> None:
    bad = {
        "selector": {"matchLabels": {"a": "b"}},
        "targetPorts": [{"number": 8080}],
        "extensionRef": {"name": "x"},
    }
    with pytest.raises(jsonschema.ValidationError):  # v1 renamed extensionRef: an old manifest fails
        jsonschema.validate(bad, INFERENCE_POOL_V1_SPEC)


def test_pool_selects_forge_pods_on_their_port_and_the_picker_exists(docs: list[dict[str, Any]]) -> None:
    pool = _one(docs, "InferencePool", "forge")["spec"]
    sts = _one(docs, "StatefulSet", "forge")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in pool["selector"]["matchLabels"].items())
    assert pod_labels["llm-d.ai/engine-type"] == "rocmforge"  # the picker's engine for forge's gauges
    container = sts["spec"]["template"]["spec"]["containers"][0]
    ports = {p["containerPort"] for p in container["ports"]}
    assert [p["number"] for p in pool["targetPorts"]] == [8080] and 8080 in ports
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FORGE_SERVER__METRICS_PUBLIC"] == "true"  # the picker scrapes the target port, keyless
    epp_service = _one(docs, "Service", "forge-epp")
    assert epp_service["spec"]["ports"][0]["port"] == pool["endpointPickerRef"]["port"]["number"]
    epp = _one(docs, "Deployment", "forge-epp")["spec"]["template"]["spec"]
    args = epp["containers"][0]["args"]
    assert args[args.index("--pool-name") + 1] == "forge"


def engine_specs(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The rocmforge engine's metric specs from the shipped EndpointPickerConfig."""
    text = _one(docs, "ConfigMap", "forge-epp-config")["data"]["epp-config.yaml"]
    config = yaml.safe_load(text)
    assert config["kind"] == "EndpointPickerConfig"
    extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
    engines = {e["name"]: e for e in extractor["parameters"]["engineConfigs"]}
    return {k: v for k, v in engines["rocmforge"].items() if k.endswith("Spec")}


_SPEC_RE = re.compile(r"^\s*(\S+?)\s*(?:\{([^}]*)\})?\s*$")


def resolve(spec: str, metrics_text: str) -> list[tuple[dict[str, str], float]]:
    """Every series a picker spec matches, in exposition order (the picker takes the first), by
    llm-d-router's rules (core-metrics-extractor spec.go: name, then label equality filters)."""
    m = _SPEC_RE.match(spec)
    assert m, spec
    name, block = m[1], m[2] or ""
    wanted = dict(re.findall(r'(\w+)\s*=\s*"?([^",}]*)"?', block))
    out = []
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in wanted.items()):
                out.append((dict(s.labels), s.value))
    return out


def test_every_engine_spec_names_a_forge_gauge(docs: list[dict[str, Any]]) -> None:
    from rocmforge_supervisor.service._pool_metrics import PoolSample, pool_families

    samples = [PoolSample("a", 2, 1, 300, 1024, ("adapter",)), PoolSample("b", 0, 1, 0, 2048)]
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.registry import Collector

    class _C(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            return pool_families(samples)

    reg = CollectorRegistry()
    reg.register(_C())
    text = generate_latest(reg).decode()
    specs = engine_specs(docs)
    assert set(specs) >= {"queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec"}
    for key, spec in specs.items():
        found = resolve(spec, text)
        assert len(found) == 1, f"{key}: {spec} matches {len(found)} series"
    assert resolve(specs["queuedRequestsSpec"], text)[0][1] == 2
    assert resolve(specs["runningRequestsSpec"], text)[0][1] == 2
    assert resolve(specs["kvUsageSpec"], text)[0][1] == pytest.approx(300 / 3072)
    assert resolve(specs["cacheInfoSpec"], text)[0][0] == {"block_size": "1", "num_gpu_blocks": "3072"}
    # A pool per model: the same gauges filtered by the model label resolve to one series each.
    assert resolve('forge_model_requests_waiting{model="a"}', text) == [({"model": "a"}, 2.0)]
    assert len(resolve('forge_model_kv_cache_usage_ratio{model="b"}', text)) == 1


def test_component_files_parse() -> None:
    for f in COMPONENT.glob("*.yaml"):
        assert list(yaml.safe_load_all(Path(f).read_text()))
