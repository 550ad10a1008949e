"""Write the FileDescriptorSet of the OTLP .proto files ours import, for protoc and buf.

``proto/gpumetrics/processcontext/v1/process_context.proto`` imports OTLP's
``common/v1/common.proto`` and ``resource/v1/resource.proto``. The opentelemetry-proto wheel
(a dependency) ships the generated modules but not the ``.proto`` sources, so their descriptors
are taken from the modules themselves and handed to ``protoc --descriptor_set_in``: the
generated code then imports the wheel's modules, and no ``.proto`` file is copied here.

Usage: ``python scripts/otlp_descriptors.py OUT.binpb``
"""

import sys

from google.protobuf import descriptor_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2


def main(out: str) -> None:
    """Write the descriptors of OTLP's common and resource files (dependencies first) to ``out``."""
    files = descriptor_pb2.FileDescriptorSet()
    for module in (common_pb2, resource_pb2):
        module.DESCRIPTOR.CopyToProto(files.file.add())
    with open(out, "wb") as f:
        f.write(files.SerializeToString(deterministic=True))


if __name__ == "__main__":
    main(sys.argv[1])
