"""The wire protocol: generated code works, and matches what protos/ generates now."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERATED_DIR = REPO / "gwtf" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def test_flow_message_round_trips() -> None:
    from gwtf.v1 import flow_pb2

    sent = flow_pb2.FlowMessage(
        sender="node-a",
        receiver="node-b",
        sender_epoch=7,
        receiver_epoch=3,
        gen=2,
        from_tail=True,
        price=-1_250_000,
        flow=2**40,
        echo=5,
        eps=25_000,
    )
    received = flow_pb2.FlowMessage.FromString(sent.SerializeToString())
    assert received == sent
    assert (received.sender, received.receiver) == ("node-a", "node-b")
    assert (received.sender_epoch, received.receiver_epoch, received.gen) == (7, 3, 2)
    assert received.from_tail is True
    assert received.price == -1_250_000
    assert (received.flow, received.echo, received.eps) == (2**40, 5, 25_000)


def test_proto_mirrors_the_state_machine_message() -> None:
    from gwtf.flow.relax.decentralized import FlowMessage
    from gwtf.v1 import flow_pb2

    proto_fields = [f.name for f in flow_pb2.FlowMessage.DESCRIPTOR.fields]
    assert proto_fields == list(FlowMessage._fields)


def test_grpc_stubs_import_with_this_grpc_runtime() -> None:
    # The generated _grpc module refuses (raises at import) a grpcio older than grpcio-tools.
    from gwtf.v1 import flow_pb2_grpc

    assert hasattr(flow_pb2_grpc, "FlowStub")
    assert hasattr(flow_pb2_grpc, "FlowServicer")


def _generated_files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name.endswith(GENERATED_SUFFIXES)
    }


def test_generated_code_matches_protos(tmp_path: Path) -> None:
    protos = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "protos").rglob("*.proto"))
    assert protos, "no .proto files under protos/"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iprotos",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            *protos,
        ],
        cwd=REPO,
        check=True,
        timeout=120,
    )
    fresh = _generated_files(tmp_path / "gwtf" / "v1")
    present = _generated_files(GENERATED_DIR)
    assert fresh, "protoc generated nothing"
    assert sorted(present) == sorted(fresh), "run `make proto`: generated files are stale"
    for name, content in fresh.items():
        assert present[name] == content, f"gwtf/v1/{name} is stale: run `make proto`"
