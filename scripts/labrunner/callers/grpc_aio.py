"""The lab's grpc.aio caller: ListRecords and CreateRecords through the generated stub, records read
from and filled into the messages as the lab's gRPC servers do (services.common.messages)."""

from collections.abc import Sequence
from pathlib import Path

import grpc
import grpc.aio

from labrunner.callers.harness import CALL_TIMEOUT_S, Reply, serve_calls
from services.common.caller_loop import CallerSettings, run
from services.common.messages import fill_record, record_from_message
from services.common.pb import cars_pb2, cars_pb2_grpc
from services.common.records import Record


class GrpcClient:
    def __init__(self, settings: CallerSettings) -> None:
        if settings.ca_file is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=Path(settings.ca_file).read_bytes())
            self._channel = grpc.aio.secure_channel(settings.address, credentials)
        else:
            self._channel = grpc.aio.insecure_channel(settings.address)
        self._stub = cars_pb2_grpc.RecordServiceStub(self._channel)

    async def download(self, count: int, offset: int | None = None) -> list[Record]:
        request = cars_pb2.ListRecordsRequest(count=count, offset=offset)
        reply = await self._stub.ListRecords(request, timeout=CALL_TIMEOUT_S)
        return [record_from_message(message) for message in reply.records]

    async def upload(self, records: Sequence[Record]) -> Reply:
        request = cars_pb2.CreateRecordsRequest()
        add = request.records.add
        for record in records:
            fill_record(add(), record)
        reply = await self._stub.CreateRecords(request, timeout=CALL_TIMEOUT_S)
        return Reply(reply.count, reply.checksum)

    async def close(self) -> None:
        await self._channel.close()


if __name__ == "__main__":
    run(lambda settings: serve_calls(settings, GrpcClient))
