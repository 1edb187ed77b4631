// gRPC unary load (see docs/CONTRACTS.md): RecordService/ListRecords({count: COUNT}) (or the SHAPE's
// service's); or, with UPLOAD_FILE set, CreateRecords with the records of that file (an upload).
// Env: GRPC_ADDR, TLS, PROTO_DIR, COUNT, SHAPE, CHECK_EVERY, SUMMARY_FILE and the load model's
// (k6/lib/common.js); UPLOAD_FILE and UPLOAD_COUNT (k6/lib/common.js uploadFile).
import { check } from 'k6';
import grpc from 'k6/net/grpc';
import {
  COUNT, buildOptions, connectOnce, grpcClient, method, uploadFile, logFirstFailure, record, recordChecks,
  sampled, summaryHandler, uploadReplyChecks,
  DECODED, UNDECODED,
} from './lib/common.js';

// The latency clock: k6's own timer of the undecoded requests (k6/lib/common.js).
const CLOCK = 'grpc_req_duration{decoded:no}';
export const handleSummary = summaryHandler(CLOCK);

const UPLOAD = uploadFile();
const METHOD = method(UPLOAD ? 'CreateRecords' : 'ListRecords');
// The one request of every call, made once here: k6 marshals it per call.
const REQUEST = UPLOAD ? { records: UPLOAD.records } : { count: COUNT };
// Throughput calls drop the response in Go; sampled calls decode it for checking.
const FAST = { discardResponseMessage: true, tags: UNDECODED };
const DECODE = { tags: DECODED };

const client = grpcClient();

export const options = buildOptions(CLOCK);

function replyChecks(res) {
  if (UPLOAD) return uploadReplyChecks(res.message, UPLOAD);
  return recordChecks(res.message ? res.message.records : null, true);
}

export default function () {
  connectOnce(client);
  const decode = sampled();
  const res = client.invoke(METHOD, REQUEST, decode ? DECODE : FAST);
  let ok = res.status === grpc.StatusOK;
  if (!ok) logFirstFailure(`${METHOD} status ${res.status}: ${JSON.stringify(res.error)}`);
  if (decode) ok = check(res, Object.assign({ 'status is OK': () => ok }, replyChecks(res)));
  record(ok);
}
