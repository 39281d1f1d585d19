"""A pod's configuration as a kubelet resolves it: volumes, environment, ServiceAccount tokens, field references."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

TOKEN_TTL_SECONDS = 3600


class ConfigError(Exception):
    """The pod cannot start yet (missing Secret, ConfigMap or ServiceAccount)."""


class PodConfig:
    """Reads what a pod refers to from the API server and turns it into files and environment variables."""

    def __init__(self, core: client.CoreV1Api, *, base_env: dict[str, str], api_host: str, api_port: int) -> None:
        self.core = core
        self.base_env = base_env
        self.api_host, self.api_port = api_host, api_port

    def volumes(self, pod: dict[str, Any], pod_dir: Path) -> dict[str, Path]:
        """Each volume's files on the host, by volume name."""
        namespace = pod["metadata"]["namespace"]
        sources: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            name = volume["name"]
            target = pod_dir / "volumes" / name
            if "emptyDir" in volume:
                target.mkdir(parents=True, exist_ok=True)
                target.chmod(0o1777)
                sources[name] = target
            elif "hostPath" in volume:
                path = Path(volume["hostPath"]["path"])
                if volume["hostPath"].get("type") in ("DirectoryOrCreate", None, ""):
                    path.mkdir(parents=True, exist_ok=True)
                sources[name] = path
            elif "secret" in volume or "configMap" in volume:
                write_files(target, self._volume_data(namespace, volume))
                sources[name] = target
            elif "projected" in volume:
                write_files(target, self._projected_data(pod, volume["projected"]))
                sources[name] = target
        return sources

    def _projected_data(self, pod: dict[str, Any], projected: dict[str, Any]) -> dict[str, bytes]:
        """Files of a projected volume: what ServiceAccount admission adds to every pod."""
        files: dict[str, bytes] = {}
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                files[token["path"]] = self._token(pod, token).encode()
            elif "configMap" in source or "secret" in source:
                files.update(self._volume_data(pod["metadata"]["namespace"], source))
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    if "fieldRef" in item:
                        files[item["path"]] = field_ref(pod, item["fieldRef"]["fieldPath"]).encode()
        return files

    def _token(self, pod: dict[str, Any], token: dict[str, Any]) -> str:
        """A real bound ServiceAccount token from the TokenRequest API."""
        account = pod["spec"].get("serviceAccountName") or "default"
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[token["audience"]] if token.get("audience") else [],
            expiration_seconds=token.get("expirationSeconds") or TOKEN_TTL_SECONDS,
            bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=pod["metadata"]["name"], uid=pod["metadata"]["uid"]),
        ))
        try:
            reply = self.core.create_namespaced_service_account_token(
                account, pod["metadata"]["namespace"], request)
        except ApiException as error:
            if error.status == 404:
                raise ConfigError(f'serviceaccount "{account}" not found') from None
            raise
        assert reply.status is not None
        return str(reply.status.token)

    def _volume_data(self, namespace: str, volume: dict[str, Any]) -> dict[str, bytes]:
        if "secret" in volume:
            ref = volume["secret"]
            secret = self._read("secret", namespace, ref["secretName"], ref.get("optional"))
            raw = {k: base64.b64decode(v) for k, v in ((secret.data if secret else None) or {}).items()}
        else:
            ref = volume["configMap"]
            cm = self._read("configmap", namespace, ref["name"], ref.get("optional"))
            raw = {k: v.encode() for k, v in ((cm.data if cm else None) or {}).items()}
        items = ref.get("items")
        if items:
            return {item["path"]: raw[item["key"]] for item in items if item["key"] in raw}
        return raw

    def _read(self, kind: str, namespace: str, name: str, optional: bool | None) -> Any:
        try:
            if kind == "secret":
                return self.core.read_namespaced_secret(name, namespace)
            return self.core.read_namespaced_config_map(name, namespace)
        except ApiException as error:
            if error.status == 404:
                if optional:
                    return None
                raise ConfigError(f'{kind} "{name}" not found') from None
            raise

    def container_env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        namespace = pod["metadata"]["namespace"]
        env = dict(self.base_env)
        env.update({
            "HOSTNAME": pod["metadata"]["name"],
            "KUBERNETES_SERVICE_HOST": self.api_host,
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.api_port),
        })
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "secretRef" in source:
                ref = source["secretRef"]
                secret = self._read("secret", namespace, ref["name"], ref.get("optional"))
                for k, v in ((secret.data if secret else None) or {}).items():
                    env[prefix + k] = base64.b64decode(v).decode()
            elif "configMapRef" in source:
                ref = source["configMapRef"]
                cm = self._read("configmap", namespace, ref["name"], ref.get("optional"))
                env.update({prefix + k: v for k, v in ((cm.data if cm else None) or {}).items()})
        for var in container.get("env") or []:
            if "valueFrom" not in var:
                env[var["name"]] = expand(var.get("value", ""), env)
                continue
            value = self._env_value_from(pod, var["valueFrom"])
            if value is not None:
                env[var["name"]] = value
        return env

    def _env_value_from(self, pod: dict[str, Any], source: dict[str, Any]) -> str | None:
        namespace = pod["metadata"]["namespace"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            secret = self._read("secret", namespace, ref["name"], ref.get("optional"))
            data = (secret.data if secret else None) or {}
            if ref["key"] not in data:
                if ref.get("optional"):
                    return None
                raise ConfigError(f'couldn\'t find key {ref["key"]} in Secret {namespace}/{ref["name"]}')
            return base64.b64decode(data[ref["key"]]).decode()
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            cm = self._read("configmap", namespace, ref["name"], ref.get("optional"))
            data = (cm.data if cm else None) or {}
            if ref["key"] not in data:
                if ref.get("optional"):
                    return None
                raise ConfigError(f'couldn\'t find key {ref["key"]} in ConfigMap {namespace}/{ref["name"]}')
            return str(data[ref["key"]])
        if "fieldRef" in source:
            return field_ref(pod, source["fieldRef"]["fieldPath"])
        return None


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values; $$ escapes."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and ")" in text[i:]:
            end = text.index(")", i)
            name = text[i + 2:end]
            out.append(env.get(name, text[i:end + 1]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def field_ref(pod: dict[str, Any], path: str) -> str:
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1", "status.podIPs": "127.0.0.1",
    }
    if path in simple:
        return str(simple[path] or "")
    for prefix, source in (("metadata.labels", meta.get("labels")), ("metadata.annotations", meta.get("annotations"))):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((source or {}).get(path[len(prefix) + 2:-2], ""))
    raise ConfigError(f"unsupported fieldRef {path}")


def write_files(directory: Path, files: dict[str, bytes]) -> None:
    """Write a volume's files atomically, so a running process never reads half a token."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(content)
        tmp.chmod(0o644)
        tmp.replace(target)
