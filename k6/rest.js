// REST load (see docs/CONTRACTS.md): GET BASE_URL/records?count=COUNT over HTTP/1.1 or HTTP/2; or,
// with UPLOAD_FILE set, an upload: POST BASE_URL/records with that file's bytes as the body.
// Env: BASE_URL, EXPECT_PROTO, COUNT, SHAPE, CHECK_EVERY, SUMMARY_FILE, STREAMS, CHURN and the load model's
// (k6/lib/common.js); for an upload UPLOAD_FILE (an absolute path to the exact body, written by the
// runner before the run) and UPLOAD_COUNT (the records in it, default: as many as it holds), which
// a checked reply's count and checksum must match (k6/lib/common.js restUpload).
// STREAMS (default 1): with more, each iteration sends STREAMS of the same request at once (http.batch,
// batchPerHost STREAMS) on its VU's one HTTP/2 connection; HTTP/1.1 cannot multiplex, and is refused.
// CHURN (unset: never): N, every N-th request of a VU carries Connection: close (a decoded one or
// not, an upload too), so k6 closes that connection after its response and opens a new one for the
// next request (HTTP/1.1: when the response says Connection: close too, as every lab server's does);
// STREAMS must then be 1. protolab_connections counts a VU's first request and each after a
// Connection: close one (k6/lib/common.js requestCloses).
// COMPRESSION (default identity): gzip, every GET says Accept-Encoding: gzip, and a checked response
// must have come gzip-compressed (Content-Encoding: gzip; k6 decompresses it to check the records).
import { check } from 'k6';
import exec from 'k6/execution';
import http from 'k6/http';
import {
  COUNT, STREAMS, batchOptions, buildOptions, envString, logFirstFailure, record, recordChecks, requestCloses,
  restUpload, sampled, summaryHandler, uploadReplyChecks,
  DECODED, UNDECODED,
} from './lib/common.js';

// The latency clock: k6's own timer of the undecoded requests (k6/lib/common.js), sending +
// waiting + receiving: connection setup is excluded, as gRPC's calls run on a connected client.
const CLOCK = 'http_req_duration{decoded:no,expected_response:true}';
export const handleSummary = summaryHandler(CLOCK);

const PROTOCOLS = ['HTTP/1.1', 'HTTP/2.0'];
const EXPECT_PROTO = envString('EXPECT_PROTO', 'HTTP/1.1');
if (!PROTOCOLS.includes(EXPECT_PROTO)) {
  throw new Error(`protolab: EXPECT_PROTO=${EXPECT_PROTO}, want one of ${PROTOCOLS.join(', ')}`);
}
if (EXPECT_PROTO === 'HTTP/1.1' && STREAMS > 1) {
  throw new Error(
    `protolab: HTTP/1.1 cannot multiplex: STREAMS=${STREAMS} needs HTTP/2 ` +
    `(its comparable is ${STREAMS} connections: VUS x ${STREAMS}, STREAMS=1)`,
  );
}
const COMPRESSIONS = ['identity', 'gzip'];
const COMPRESSION = envString('COMPRESSION', 'identity');
if (!COMPRESSIONS.includes(COMPRESSION)) {
  throw new Error(`protolab: COMPRESSION=${COMPRESSION}, want one of ${COMPRESSIONS.join(', ')}`);
}
const GZIP = COMPRESSION === 'gzip';
const BASE_URL = envString('BASE_URL').replace(/\/+$/, '');
const URL = `${BASE_URL}/records?count=${COUNT}`;
const LIST = `GET ${URL}`;

// Throughput requests skip the body entirely; sampled ones keep it for checking.
const ACCEPT = GZIP ? { headers: { 'Accept-Encoding': 'gzip' } } : {};
const FAST = Object.assign({ responseType: 'none', tags: UNDECODED }, ACCEPT);
const DECODE = Object.assign({ responseType: 'text', tags: DECODED }, ACCEPT);

// An upload sends the same bytes every iteration, read once per VU here in init.
const UPLOAD = restUpload();
const UPLOAD_URL = `${BASE_URL}/records`;
const POST = `POST ${UPLOAD_URL}`;
const UPLOAD_HEADERS = { 'Content-Type': 'application/json' };
// An upload's params: FAST's or DECODE's with the upload's headers added to theirs (Accept-Encoding).
const withUploadHeaders = (params) => Object.assign({}, params, {
  headers: Object.assign({}, params.headers, UPLOAD_HEADERS),
});
const UPLOAD_FAST = withUploadHeaders(FAST);
const UPLOAD_DECODE = withUploadHeaders(DECODE);

// A request's params, chosen by whether k6 decodes it and whether it is its connection's last (CHURN),
// which carries Connection: close: every object made once here.
function closing(params) {
  return Object.assign({}, params, { headers: Object.assign({}, params.headers, { Connection: 'close' }) });
}
function paramsOf(fast, decoded) {
  const open = [fast, decoded];
  const last = [closing(fast), closing(decoded)];
  return (decode, close) => (close ? last : open)[decode ? 1 : 0];
}
const LIST_PARAMS = paramsOf(FAST, DECODE);
const UPLOAD_PARAMS = paramsOf(UPLOAD_FAST, UPLOAD_DECODE);

export const options = Object.assign(buildOptions(CLOCK), batchOptions());

function parsed(res) {
  try {
    return JSON.parse(res.body);
  } catch (_) {
    return null;
  }
}

// A response's checks and metrics: the protocol (a measured HTTP/2 run must never silently fall
// back to HTTP/1.1, or the reverse), the status, and a sampled response's content.
function finish(res, decode, request, contentChecks) {
  if (res.status !== 0 && res.proto !== EXPECT_PROTO) {
    exec.test.abort(`protolab: server negotiated ${res.proto} but EXPECT_PROTO=${EXPECT_PROTO} (${request})`);
  }
  let ok = res.status === 200;
  if (!ok) logFirstFailure(`${request}: status ${res.status} ${res.error}`);
  if (decode) {
    ok = check(res, Object.assign({ 'status is 200': () => ok }, contentChecks(parsed(res), res)));
  }
  record(ok);
}

const listChecks = GZIP
  ? (body, res) => Object.assign(
    { 'compressed with gzip': () => res.headers['Content-Encoding'] === 'gzip' },
    recordChecks(body && body.records),
  )
  : (body) => recordChecks(body && body.records);
const uploadChecks = (reply) => uploadReplyChecks(reply, UPLOAD);

function listRecords() {
  const decode = sampled();
  const res = http.get(URL, LIST_PARAMS(decode, requestCloses()));
  finish(res, decode, LIST, listChecks);
}

function uploadRecords() {
  const decode = sampled();
  const res = http.post(UPLOAD_URL, UPLOAD.body, UPLOAD_PARAMS(decode, requestCloses()));
  finish(res, decode, POST, uploadChecks);
}

// STREAMS > 1: STREAMS of the request at once on the VU's connection, each response finished as a
// single request's; which are decoded is decided per request (sampled(i)). The VU's first iteration
// sends its first request alone, to open the connection: a batch that finds none has Go's HTTP/2
// transport dial a TLS connection per request, closing all but one once ALPN says h2 (seen: up to
// 10 connections for VUS=2, STREAMS=5), where the connection model holds one per VU. (No CHURN with
// STREAMS > 1: requestCloses only counts the requests, and the VU's one connection at its first.)
function batchOf(method, url, body, fast, decoded, request, contentChecks) {
  return function () {
    const decodes = Array.from({ length: STREAMS }, (_, i) => sampled(i));
    decodes.forEach(() => requestCloses());
    const requests = decodes.map((decode) => [method, url, body, decode ? decoded : fast]);
    const responses = __ITER === 0
      ? [http.request(...requests[0])].concat(http.batch(requests.slice(1)))
      : http.batch(requests);
    responses.forEach((res, i) => finish(res, decodes[i], request, contentChecks));
  };
}

function single() {
  return UPLOAD ? uploadRecords : listRecords;
}

function batched() {
  if (UPLOAD) return batchOf('POST', UPLOAD_URL, UPLOAD.body, UPLOAD_FAST, UPLOAD_DECODE, POST, uploadChecks);
  return batchOf('GET', URL, null, FAST, DECODE, LIST, listChecks);
}

export default STREAMS === 1 ? single() : batched();
