// gRPC unary load (see docs/CONTRACTS.md): RecordService/ListRecords({count: COUNT}) (or the SHAPE's
// service's); or, with UPLOAD_FILE set, CreateRecords with the records of that file (an upload).
// Env: GRPC_ADDR, TLS, PROTO_DIR, COUNT, SHAPE, CHECK_EVERY, SUMMARY_FILE, STREAMS, CHURN and the load model's
// (k6/lib/common.js); UPLOAD_FILE and UPLOAD_COUNT (k6/lib/common.js uploadFile).
// STREAMS (default 1, one synchronous invoke): with more, each iteration makes STREAMS calls at once
// (asyncInvoke) on its VU's one connection and ends when all have answered.
// CHURN (unset: never): N, each VU closes its client after every N calls (client.close() once the N-th
// has answered) and its next call connects again; STREAMS must then be 1. protolab_connections counts
// every connect (k6/lib/common.js connectForCall).
import { check } from 'k6';
import grpc from 'k6/net/grpc';
import {
  COUNT, STREAMS, buildOptions, closeIfChurned, connectForCall, grpcClient, method, uploadFile, logFirstFailure,
  record, recordChecks, sampled, summaryHandler, uploadReplyChecks,
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

// A reply's checks and metrics: the status, and a sampled reply's content.
function finish(res, decode) {
  let ok = res.status === grpc.StatusOK;
  if (!ok) logFirstFailure(`${METHOD} status ${res.status}: ${JSON.stringify(res.error)}`);
  if (decode) ok = check(res, Object.assign({ 'status is OK': () => ok }, replyChecks(res)));
  record(ok);
}

function callOnce() {
  connectForCall(client);
  const decode = sampled();
  const res = client.invoke(METHOD, REQUEST, decode ? DECODE : FAST);
  finish(res, decode);
  closeIfChurned(client);
}

// STREAMS > 1: STREAMS calls at once on the VU's connection; which are decoded is decided per call.
async function callStreams() {
  connectForCall(client);
  const decodes = Array.from({ length: STREAMS }, (_, i) => sampled(i));
  const replies = await Promise.all(
    decodes.map((decode) => client.asyncInvoke(METHOD, REQUEST, decode ? DECODE : FAST)),
  );
  replies.forEach((res, i) => finish(res, decodes[i]));
}

export default STREAMS === 1 ? callOnce : callStreams;
