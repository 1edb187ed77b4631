// gRPC streaming load (see docs/CONTRACTS.md): RecordService/StreamRecords({count: COUNT}) (or the
// SHAPE's service's), one record per message from the server; or, with UPLOAD_FILE set, RecordService/UploadRecords, each
// record of that file one message from the client, then the server's one reply. One protolab_reqs
// per completed stream.
// Env: GRPC_ADDR, TLS, PROTO_DIR, COUNT, SHAPE, CHECK_EVERY, SUMMARY_FILE, STREAMS, CHURN and the load model's
// (k6/lib/common.js); UPLOAD_FILE and UPLOAD_COUNT (k6/lib/common.js uploadFile).
// STREAMS (default 1): each iteration opens STREAMS streams at once on its VU's one connection, each
// with its own handlers and one protolab_reqs outcome; k6's event loop ends the iteration when all end.
// CHURN (unset: never): N, each VU closes its client after every N streams (calls) and connects again;
// STREAMS must then be 1. The close waits for the next iteration's start, when the N-th stream has
// ended and k6 has run its every event (k6/lib/common.js connectForCall). protolab_connections counts
// every connect.
import { check } from 'k6';
import { Stream } from 'k6/net/grpc';
import {
  COUNT, STREAMS, buildOptions, connectForCall, grpcClient, method, uploadFile, logFirstFailure, record,
  recordChecks, sampled, summaryHandler, uploadReplyChecks,
  DECODED, UNDECODED,
} from './lib/common.js';

// The latency clock: k6's own timer of the undecoded requests (k6/lib/common.js).
const CLOCK = 'grpc_req_duration{decoded:no}';
export const handleSummary = summaryHandler(CLOCK);

const UPLOAD = uploadFile();
const METHOD = method(UPLOAD ? 'UploadRecords' : 'StreamRecords');
const REQUEST = { count: COUNT };
// Throughput streams drop each message in Go (k6 still emits an empty 'data' event per
// message, so counting works); sampled streams decode them for checking.
const FAST = { discardResponseMessage: true, tags: UNDECODED };
const DECODE = { tags: DECODED };

const client = grpcClient();

export const options = buildOptions(CLOCK);

// The server's messages a stream must end with, and the checks of the decoded ones.
const WANT = UPLOAD ? 1 : COUNT;
function messageChecks(received) {
  if (UPLOAD) return uploadReplyChecks(received[0], UPLOAD);
  return recordChecks(received, true);
}

export default function () {
  connectForCall(client);
  for (let i = 0; i < STREAMS; i += 1) openStream(sampled(i));
}

// One stream, written and ended; its handlers record its one outcome.
function openStream(decode) {
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
    let ok = count === WANT;
    if (!ok) logFirstFailure(`${METHOD} ended after ${count} messages, want ${WANT}`);
    if (decode) ok = check(received, messageChecks(received));
    finish(ok);
  });
  if (UPLOAD) {
    // The same parsed records every stream: k6 marshals each as it writes it.
    for (const message of UPLOAD.records) stream.write(message);
  } else {
    stream.write(REQUEST);
  }
  stream.end();
}
