// REST load: GET BASE_URL/records?count=COUNT over HTTP/1.1 or HTTP/2 (see docs/CONTRACTS.md).
import { check } from 'k6';
import exec from 'k6/execution';
import http from 'k6/http';
import {
  COUNT, buildOptions, envString, logFirstFailure, record, recordChecks, sampled,
  summaryHandler,
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
const URL = `${envString('BASE_URL').replace(/\/+$/, '')}/records?count=${COUNT}`;

// Throughput requests skip the body entirely; sampled ones keep it for checking.
const FAST = { responseType: 'none', tags: UNDECODED };
const DECODE = { responseType: 'text', tags: DECODED };

export const options = buildOptions(CLOCK);

function parseRecords(res) {
  try {
    return JSON.parse(res.body).records;
  } catch (_) {
    return null;
  }
}

export default function () {
  const decode = sampled();
  const res = http.get(URL, decode ? DECODE : FAST);
  // A measured HTTP/2 run must never silently fall back to HTTP/1.1 (or the reverse).
  if (res.status !== 0 && res.proto !== EXPECT_PROTO) {
    exec.test.abort(`protolab: server negotiated ${res.proto} but EXPECT_PROTO=${EXPECT_PROTO} (${URL})`);
  }
  let ok = res.status === 200;
  if (!ok) logFirstFailure(`GET ${URL}: status ${res.status} ${res.error}`);
  if (decode) {
    const checks = Object.assign({ 'status is 200': () => ok }, recordChecks(parseRecords(res)));
    ok = check(res, checks);
  }
  record(ok);
}
