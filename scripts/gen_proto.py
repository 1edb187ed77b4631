"""Generate the Python protobuf and gRPC stubs from proto/cars.proto into services/common/pb/.

Stubs are generated at install and image-build time, never committed, so they cannot
drift from the proto. The virtual include path maps proto/ to services/common/pb, so
the generated gRPC module imports `services.common.pb.cars_pb2` as a package import.
"""

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto" / "cars.proto"
OUT_PACKAGE = ROOT / "services" / "common" / "pb"


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
            str(PROTO),
        ]
    )
    if rc != 0:
        print(f"protoc failed with exit code {rc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
