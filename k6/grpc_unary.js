// gRPC unary load: RecordService/ListRecords({count: COUNT}) (see docs/CONTRACTS.md).
import { check } from 'k6';
import grpc from 'k6/net/grpc';
import {
  COUNT, buildOptions, connectOnce, grpcClient, logFirstFailure, record, recordChecks,
  sampled, summaryHandler,
  DECODED, UNDECODED,
} from './lib/common.js';

// The latency clock: k6's own timer of the undecoded requests (k6/lib/common.js).
const CLOCK = 'grpc_req_duration{decoded:no}';
export const handleSummary = summaryHandler(CLOCK);

const METHOD = 'protolab.cars.v1.RecordService/ListRecords';
const REQUEST = { count: COUNT };
// Throughput calls drop the response in Go; sampled calls decode it for checking.
const FAST = { discardResponseMessage: true, tags: UNDECODED };
const DECODE = { tags: DECODED };

const client = grpcClient();

export const options = buildOptions(CLOCK);

export default function () {
  connectOnce(client);
  const decode = sampled();
  const res = client.invoke(METHOD, REQUEST, decode ? DECODE : FAST);
  let ok = res.status === grpc.StatusOK;
  if (!ok) logFirstFailure(`${METHOD} status ${res.status}: ${JSON.stringify(res.error)}`);
  if (decode) {
    const records = res.message ? res.message.records : null;
    ok = check(res, Object.assign({ 'status is OK': () => ok }, recordChecks(records, true)));
  }
  record(ok);
}
