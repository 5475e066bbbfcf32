"""How long ``make image`` takes, and how much a rebuild adds, after the edits a project sees most.

``python -m bench.image_build [--cold] [--docker /usr/bin/docker] [--ca-bundle PATH]``

Builds a copy of the working tree (its tracked and untracked, not ignored files) under the tag
``spo-service:bench-build``: once as it is (``--cold`` first removes the daemon's whole build cache,
every project's, so the first build starts from the base image alone), again unchanged, then after a
code change (a comment appended to ``app/__init__.py``) and after an edit of ``pyproject.toml`` that
leaves the dependencies as they are. For each: the wall seconds, and the layers of the image that the
previous build did not have, with their sizes (what a registry receives and a node pulls). Writes
``bench/results/image_build.json`` and removes the images it built. Needs a Docker daemon
(``.ci/docker-up`` starts one) and the base image.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import PROJECT_ROOT, write_result

TAG = "spo-service:bench-build"


def copy_tree(target: Path) -> None:
    """Copy the checkout's tracked and untracked, not ignored files (what git would commit) into ``target``."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = PROJECT_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


# The diff id of a layer with no files (WORKDIR of a directory that exists, say): no size of its own.
EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"


def layers(docker: str, image: str) -> list[tuple[str, int]]:
    """``image``'s layers with files, bottom first: (diff id, size in bytes)."""
    inspect = subprocess.run(
        [docker, "image", "inspect", image, "--format", "{{json .RootFS.Layers}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    ids = [layer for layer in json.loads(inspect.stdout) if layer != EMPTY_LAYER]
    history = subprocess.run(
        [docker, "history", image, "--human=false", "--format", "{{.Size}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    # One row per instruction, newest first; the ones with a size are the layers with files.
    sizes = [int(s) for s in reversed(history.stdout.split()) if int(s) > 0]
    return list(zip(ids, sizes, strict=True))


def image_id(docker: str, image: str) -> str | None:
    """``image``'s id, or None where the daemon has no such image."""
    found = subprocess.run(
        [docker, "image", "inspect", image, "--format", "{{.Id}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() if found.returncode == 0 else None


def remove_if_untagged(docker: str, image: str) -> None:
    """Remove ``image`` (an id) if no tag names it any more: what a rebuild under the same tag left.
    An image that still has a tag (someone else's, or the same build's) stays."""
    tags = subprocess.run(
        [docker, "image", "inspect", image, "--format", "{{len .RepoTags}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if tags.returncode == 0 and tags.stdout.strip() == "0":
        subprocess.run([docker, "image", "rm", image], capture_output=True, check=False)


def make_image(docker: str, image: str, ca_bundle: Path | None) -> list[str]:
    """The ``make image`` command line that builds ``image`` (pip trusting ``ca_bundle`` if given)."""
    args = ["make", "-s", "image", f"IMAGE={image}", f"DOCKER={docker}"]
    return args + ([f"CA_BUNDLE={ca_bundle}"] if ca_bundle is not None else [])


def run(docker: str, ca_bundle: Path | None, cold: bool) -> dict[str, Any]:
    builds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="spo-image-build-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        edits = {
            "as it is" + (" (build cache emptied)" if cold else ""): None,
            "unchanged": None,
            "code change (app/__init__.py)": tree / "app" / "__init__.py",
            "pyproject.toml edit, same dependencies": tree / "pyproject.toml",
        }
        if cold:
            subprocess.run([docker, "builder", "prune", "-af"], capture_output=True, check=True)
        before: set[str] = set()
        images: set[str | None] = set()  # each rebuild leaves the one before it untagged
        for what, edited in edits.items():
            if edited is not None:
                with edited.open("a", encoding="utf-8") as fh:
                    fh.write(f"# bench.image_build {time.time()}\n")
            start = time.monotonic()
            subprocess.run(
                make_image(docker, TAG, ca_bundle), cwd=tree, capture_output=True, check=True
            )
            seconds = time.monotonic() - start
            built = layers(docker, TAG)
            images.add(image_id(docker, TAG))
            new = [size for layer, size in built if layer not in before]
            before = {layer for layer, _ in built}
            builds.append(
                {
                    "build": what,
                    "seconds": round(seconds, 1),
                    "new_layers": len(new),
                    "new_layer_bytes": sum(new),
                    "image_bytes": sum(size for _, size in built),
                }
            )
            print(json.dumps(builds[-1]), flush=True)
    subprocess.run([docker, "image", "rm", TAG], capture_output=True, check=False)
    for image in filter(None, images):
        remove_if_untagged(docker, image)
    return {"builds": builds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docker", default="/usr/bin/docker")
    parser.add_argument("--ca-bundle", type=Path, default=None)
    parser.add_argument(
        "--cold",
        action="store_true",
        help="empty the daemon's whole build cache first (every project's)",
    )
    args = parser.parse_args()
    path = write_result("image_build", run(args.docker, args.ca_bundle, args.cold))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
