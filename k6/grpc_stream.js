// gRPC server-streaming load: RecordService/StreamRecords({count: COUNT}), one Record per
// message; one protolab_reqs per completed stream (see docs/CONTRACTS.md).
import { check } from 'k6';
import { Stream } from 'k6/net/grpc';
import {
  COUNT, buildOptions, connectOnce, grpcClient, logFirstFailure, record, recordChecks,
  sampled, summaryHandler,
  DECODED, UNDECODED,
} from './lib/common.js';

// The latency clock: k6's own timer of the undecoded requests (k6/lib/common.js).
const CLOCK = 'grpc_req_duration{decoded:no}';
export const handleSummary = summaryHandler(CLOCK);

const METHOD = 'protolab.cars.v1.RecordService/StreamRecords';
const REQUEST = { count: COUNT };
// Throughput streams drop each message in Go (k6 still emits an empty 'data' event per
// message, so counting works); sampled streams decode them for checking.
const FAST = { discardResponseMessage: true, tags: UNDECODED };
const DECODE = { tags: DECODED };

const client = grpcClient();

export const options = buildOptions(CLOCK);

export default function () {
  connectOnce(client);
  const decode = sampled();
  const received = [];
  let count = 0;
  let finished = false;
  // k6 emits 'error' before 'end' on a failed stream; record exactly one outcome either way.
  const finish = (ok) => {
    if (finished) return;
    finished = true;
    record(ok);
  };

  const stream = new Stream(client, METHOD, decode ? DECODE : FAST);
  stream.on('data', (message) => {
    count += 1;
    if (decode) received.push(message);
  });
  stream.on('error', (err) => {
    logFirstFailure(`${METHOD} stream error: ${JSON.stringify(err)}`);
    finish(false);
  });
  stream.on('end', () => {
    if (finished) return;
    let ok = count === COUNT;
    if (!ok) logFirstFailure(`${METHOD} ended after ${count} messages, want ${COUNT}`);
    if (decode) ok = check(received, recordChecks(received, true));
    finish(ok);
  });
  stream.write(REQUEST);
  stream.end();
}
