"""The mount namespace each container runs in: its volumes, termination-message file, read-only root and user."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

STAGING = "/run/durablerun-processnode"


def namespace_script(
    mounts: list[tuple[Path, str, bool]], security: dict[str, Any], workdir: str, image_paths: list[Path]
) -> str:
    """The shell run inside the container's mount namespace before exec'ing its command.

    Every source is first bound into a private staging tmpfs, so a mount over
    /tmp cannot hide a source that lives under /tmp; then each is bound to its
    target, parents before children; then the image's paths that a volume now
    covers are bound back, read-only.
    """
    covered = [p for p in image_paths if any(_under(p, Path(target)) for _, target, _ in mounts)]
    lines = ["set -e", f"mkdir -p {STAGING}", f"mount -t tmpfs -o mode=0755 durablerun-staging {STAGING}"]
    sources = [source for source, _, _ in mounts] + covered
    for index, source in enumerate(sources):
        stage = f"{STAGING}/{index}"
        lines.append(f"{'touch' if source.is_file() else 'mkdir'} {stage}")
        lines.append(f"mount --bind {shlex.quote(str(source))} {stage}")
    targets = [(target, read_only) for _, target, read_only in mounts] + [(str(p), True) for p in covered]
    for index, (target, read_only) in enumerate(targets):
        # The mount point must exist: an empty placeholder is made once where it is missing.
        make = "touch" if sources[index].is_file() else "mkdir -p"
        quoted = shlex.quote(target)
        lines.append(f"[ -e {quoted} ] || {{ mkdir -p {shlex.quote(str(Path(target).parent))}; {make} {quoted}; }}")
        lines.append(f"mount --bind {STAGING}/{index} {quoted}")
        if read_only:
            lines.append(f"mount -o remount,bind,ro {quoted}")
    if security.get("readOnlyRootFilesystem"):
        lines.append("mount -o remount,bind,ro /")
    lines.append(f"cd {shlex.quote(workdir)}")
    user, group = security.get("runAsUser"), security.get("runAsGroup")
    if user is not None:
        group = group if group is not None else user
        lines.append(f'exec setpriv --reuid={int(user)} --regid={int(group)} --clear-groups -- "$@"')
    else:
        lines.append('exec "$@"')
    return "\n".join(lines)


def _under(path: Path, parent: Path) -> bool:
    return path != parent and path.is_relative_to(parent)
