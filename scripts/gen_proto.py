"""Generate the Python protobuf and gRPC stubs from proto/cars.proto into services/common/pb/.

Stubs are generated at install and image-build time, never committed, so they cannot
drift from the proto. The virtual include path maps proto/ to services/common/pb, so
the generated gRPC modules import `services.common.pb.cars_pb2` as a package import.

Two gRPC stub modules come out: cars_pb2_grpc.py for grpcio (grpc_tools' built-in plugin) and
cars_grpc.py for grpclib (its protoc plugin, the protoc-gen-grpclib_python script that pip
installs beside this Python).
"""

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto" / "cars.proto"
OUT_PACKAGE = ROOT / "services" / "common" / "pb"
GRPCLIB_PLUGIN = Path(sys.executable).with_name("protoc-gen-grpclib_python")


def main() -> int:
    OUT_PACKAGE.mkdir(parents=True, exist_ok=True)
    (OUT_PACKAGE / "__init__.py").write_text('"""Generated from proto/ by scripts/gen_proto.py."""\n')
    well_known = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{well_known}",
            f"-Iservices/common/pb={ROOT / 'proto'}",
            f"--python_out={ROOT}",
            f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}",
            f"--plugin=protoc-gen-grpclib_python={GRPCLIB_PLUGIN}",
            f"--grpclib_python_out={ROOT}",
            str(PROTO),
        ]
    )
    if rc != 0:
        print(f"protoc failed with exit code {rc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
