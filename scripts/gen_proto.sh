#!/usr/bin/env bash
# Regenerate riffle_actors/protocol/proto/uniffle_pb2*.py from our uniffle.proto.
# Needs grpcio-tools (pip install -e '.[dev]'). The generated files are committed and never hand-edited.
set -euo pipefail
cd "$(dirname "$0")/.."
out=riffle_actors/protocol/proto
python -m grpc_tools.protoc -I "$out" --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" "$out/uniffle.proto"
# grpc_tools writes an absolute import of the sibling module; make it package-relative.
sed -i 's/^import uniffle_pb2 as uniffle__pb2$/from . import uniffle_pb2 as uniffle__pb2/' "$out/uniffle_pb2_grpc.py"
echo "regenerated $(ls $out/*_pb2*.py* | tr '\n' ' ')"
