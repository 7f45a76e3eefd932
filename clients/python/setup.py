"""Build hook: compiles the repository's proto/ into fenced_client._proto.

No generated code is committed. `pip install clients/python` (or
`python -m build`) runs `build_py`, which calls grpc_tools.protoc on every
`fenced/v1/*.proto` and writes the modules into the package being built.
The .proto files are found, in order, at $FENCED_PROTO_DIR, at ./proto (an
sdist, which `sdist` below fills from the repository) and at ../../proto
(this directory inside the fenced repository).
"""

import glob
import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "fenced_client"
GENERATED = "_proto"


def proto_root():
    candidates = [
        os.environ.get("FENCED_PROTO_DIR", ""),
        os.path.join(HERE, "proto"),
        os.path.join(HERE, "..", "..", "proto"),
    ]
    for root in candidates:
        if root and glob.glob(os.path.join(root, "fenced", "v1", "*.proto")):
            return os.path.normpath(root)
    raise SystemExit(
        "fenced-client build: no fenced/v1/*.proto found at $FENCED_PROTO_DIR, "
        "./proto or ../../proto; build from the fenced repository or an sdist"
    )


def generate(out_dir):
    """Runs protoc into out_dir/fenced_client/_proto and makes the generated
    modules import each other from there."""
    from grpc_tools import protoc  # the build requirement in pyproject.toml

    root = proto_root()
    protos = sorted(
        os.path.relpath(p, root)
        for p in glob.glob(os.path.join(root, "fenced", "v1", "*.proto"))
    )
    target = os.path.join(out_dir, PACKAGE, GENERATED)
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{include}",
        f"--python_out={target}",
        f"--pyi_out={target}",
        f"--grpc_python_out={target}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"fenced-client build: protoc failed on {protos} in {root}")
    # protoc writes `from fenced.v1 import x_pb2`: absolute imports of a
    # top-level `fenced` package. Point them into this package instead, so
    # the generated code cannot clash with another `fenced` on sys.path.
    prefix = f"{PACKAGE}.{GENERATED}.fenced.v1"
    for dirpath, _, files in os.walk(target):
        open(os.path.join(dirpath, "__init__.py"), "a").close()
        for name in files:
            if not name.endswith((".py", ".pyi")):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            fixed = re.sub(r"^from fenced\.v1 import", f"from {prefix} import", text, flags=re.M)
            fixed = re.sub(r"^import fenced\.v1\.", f"import {prefix}.", fixed, flags=re.M)
            if fixed != text:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(fixed)


class BuildWithProtos(build_py):
    def run(self):
        super().run()
        # An editable install imports from src/, so the modules go there
        # (they are ignored by git).
        out = os.path.join(HERE, "src") if getattr(self, "editable_mode", False) else self.build_lib
        generate(out)


class SdistWithProtos(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = proto_root()
        for path in glob.glob(os.path.join(root, "fenced", "v1", "*.proto")):
            dest = os.path.join(base_dir, "proto", os.path.relpath(path, root))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(path, dest)


setup(cmdclass={"build_py": BuildWithProtos, "sdist": SdistWithProtos})
