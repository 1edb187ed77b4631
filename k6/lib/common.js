// Shared k6 pieces for every protolab script: env parsing, load models, the connection model (VUs
// = connections, STREAMS requests at once on each, CHURN calls on each before a new one), the
// uniform protolab_* metrics, record checks and handleSummary. See docs/CONTRACTS.md.
import exec from 'k6/execution';
import { Counter, Gauge, Rate } from 'k6/metrics';
import grpc from 'k6/net/grpc';

// Uniform metrics for every protocol, so requests/s compare like for like: protolab_reqs holds
// successful requests only (a failed request is never throughput), protolab_req_failed one
// sample per attempt. Latency is k6's own: each script's clock (summaryHandler below).
export const reqs = new Counter('protolab_reqs');
export const reqFailed = new Rate('protolab_req_failed');
// k6's count of this k6 instance's initialized VUs, once per VU at its first request: the
// builtin vus_max is sampled once a second, so a shorter run (a quick shared-iterations model)
// has none, and a k6 split by execution segments must show that its VUs add up.
export const vusInitialized = new Gauge('protolab_vus');
let vusNoted = false;
// The connections the scripts open on purpose: gRPC's every connect that succeeded, REST's each VU's
// first request and every request after one that carried Connection: close (CHURN). Not the
// connections k6 (Go) may dial by itself, for instance after a server closed one.
export const connections = new Counter('protolab_connections');

// The summary's trend statistics; the runner reads the same file (scripts/labrunner/run/k6.py).
// import.meta.resolve: relative to this module, from any working directory and importing script.
const TREND_STATS = JSON.parse(open(import.meta.resolve('./trend_stats.json')));

// System tags: what the dashboards group by (proto, status, method, check), what explains a
// failure (error, error_code) and expected_response (the summary's
// http_req_duration{expected_response:true}). k6's default set also holds 'scenario', which would
// overwrite the runner's `--tag scenario=<id>` with the k6 scenario name ("main"), and url, name,
// group, service, subproto and tls_version: constant within a scenario, they only lengthened every
// sample k6 streams to InfluxDB on the measured host (the URL twice: tag name, string field url).
const SYSTEM_TAGS = [
  'proto', 'status', 'method', 'check', 'error', 'error_code', 'expected_response',
];

export function envString(name, fallback) {
  const value = __ENV[name];
  if (value !== undefined && value !== '') return value;
  if (fallback === undefined) throw new Error(`protolab: env ${name} is required`);
  return fallback;
}

export function envInt(name, fallback) {
  const raw = envString(name, fallback === undefined ? undefined : String(fallback));
  if (!/^\d+$/.test(raw)) throw new Error(`protolab: env ${name}=${raw} is not a non-negative integer`);
  return parseInt(raw, 10);
}

export const COUNT = envInt('COUNT', 100);

// The record shape the service serves (SHAPE, docs/CONTRACTS.md): its gRPC service, the checks of its
// decoded records and an upload's checksum. cars: RecordService; the others their own service with
// the same four methods, in proto/cars.proto; proto, the user's own message, the service GRPC_SERVICE
// names in the descriptor set PROTOSET (both written by the runner: docs/matrix.md).
export const SHAPE = envString('SHAPE', 'cars');
const SERVICES = {
  cars: 'protolab.cars.v1.RecordService',
  numeric: 'protolab.cars.v1.NumericRecordService',
  text: 'protolab.cars.v1.TextRecordService',
  nested: 'protolab.cars.v1.NestedRecordService',
  proto: null, // GRPC_SERVICE, read by a gRPC script only (method)
};
if (!(SHAPE in SERVICES)) {
  throw new Error(`protolab: SHAPE=${SHAPE}, want one of ${Object.keys(SERVICES).join(', ')}`);
}
// The full name of a method of the shape's service, e.g. method('ListRecords').
export function method(name) {
  return `${SERVICES[SHAPE] || envString('GRPC_SERVICE')}/${name}`;
}
export const CHECK_EVERY = Math.max(1, envInt('CHECK_EVERY', 50));
export const TLS = envString('TLS', '0') === '1';

// The connection model: k6's VUs are the connections (each VU has its own), and STREAMS (default 1)
// the requests each iteration sends at once on its VU's one connection, the iteration ending when
// all have answered (REST: http.batch over HTTP/2; gRPC: STREAMS calls or streams on one channel).
const STREAMS_RAW = envString('STREAMS', '1');
if (!/^\d+$/.test(STREAMS_RAW) || parseInt(STREAMS_RAW, 10) < 1) {
  throw new Error(`protolab: env STREAMS=${STREAMS_RAW} is not a positive integer (requests at once per VU)`);
}
export const STREAMS = parseInt(STREAMS_RAW, 10);

// Connection churn: CHURN=N, a positive integer, has each VU replace its connection after every N
// calls (requests) it made on it; unset or empty, never (one connection per VU for the whole run).
// Defined for one call at a time, so not with STREAMS > 1. null: never.
const CHURN_RAW = envString('CHURN', '');
if (CHURN_RAW !== '' && (!/^\d+$/.test(CHURN_RAW) || parseInt(CHURN_RAW, 10) < 1)) {
  throw new Error(
    `protolab: env CHURN=${CHURN_RAW} is not a positive integer (calls per connection; unset: never a new one)`,
  );
}
export const CHURN = CHURN_RAW === '' ? null : parseInt(CHURN_RAW, 10);
if (CHURN !== null && STREAMS > 1) {
  throw new Error(
    `protolab: CHURN=${CHURN} needs STREAMS=1, not STREAMS=${STREAMS} (churn counts calls made one at a time)`,
  );
}

// Decode and check this request? Every VU's first request, then 1 in CHECK_EVERY: request i of an
// iteration's STREAMS is the VU's request __ITER * STREAMS + i (STREAMS=1: this iteration's).
export function sampled(i = 0) {
  return (__ITER * STREAMS + i) % CHECK_EVERY === 0;
}

let failureLogged = false;

// Logs the first failure of each VU only, so an outage does not flood the output.
export function logFirstFailure(message) {
  if (failureLogged) return;
  failureLogged = true;
  console.error(`protolab: VU ${exec.vu.idInTest}: ${message}`);
}

// Records one finished request in the uniform metrics.
export function record(ok) {
  if (!vusNoted) {
    vusNoted = true;
    vusInitialized.add(exec.instance.vusInitialized);
  }
  reqFailed.add(!ok);
  if (ok) reqs.add(1);
}

// Parses STAGES "5s:10,20s:10,5s:0" into k6 stages.
export function parseStages(spec) {
  return spec.split(',').map((part) => {
    const match = /^\s*(\d+(?:\.\d+)?(?:ms|s|m|h))\s*:\s*(\d+)\s*$/.exec(part);
    if (!match) throw new Error(`protolab: bad STAGES entry ${part} (want e.g. 5s:10,20s:10,5s:0)`);
    return { duration: match[1], target: parseInt(match[2], 10) };
  });
}

const LOAD_MODELS = ['constant-vus', 'ramping-vus', 'constant-arrival-rate', 'shared-iterations'];

function scenarioFromEnv() {
  const model = envString('LOAD_MODEL', 'constant-vus');
  const duration = envString('DURATION', '10s');
  if (model === 'constant-vus') {
    return { executor: model, vus: envInt('VUS', 10), duration };
  }
  if (model === 'ramping-vus') {
    return { executor: model, startVUs: 0, stages: parseStages(envString('STAGES')) };
  }
  if (model === 'constant-arrival-rate') {
    const preAllocatedVUs = envInt('PRE_ALLOCATED_VUS', envInt('VUS', 10));
    return {
      executor: model,
      rate: envInt('RATE'),
      timeUnit: '1s',
      duration,
      preAllocatedVUs,
      maxVUs: envInt('MAX_VUS', preAllocatedVUs),
    };
  }
  if (model === 'shared-iterations') {
    // Sequential latency: VUS clients (1: one request at a time) share ITERATIONS iterations (of
    // STREAMS requests each); DURATION caps the run.
    return {
      executor: model, vus: envInt('VUS', 1), iterations: envInt('ITERATIONS'), maxDuration: duration,
    };
  }
  throw new Error(`protolab: unknown LOAD_MODEL=${model} (want ${LOAD_MODELS.join(', ')})`);
}

// Tags of a request: whether k6 decoded its reply (a sampled request, checked). Each script's
// latency clock counts undecoded requests only, so no decode is ever inside the timed window.
export const UNDECODED = { decoded: 'no' };
export const DECODED = { decoded: 'yes' };

// k6 options shared by every script: one scenario "main" from the env load model. `clock`: the
// script's latency metric (a submetric such as grpc_req_duration{decoded:no}); a threshold that
// always holds makes k6 keep it in the summary, which has submetrics only for thresholds.
export function buildOptions(clock) {
  return {
    scenarios: { main: scenarioFromEnv() },
    thresholds: {
      protolab_req_failed: [{ threshold: 'rate<0.01', abortOnFail: false }],
      checks: [{ threshold: 'rate==1.0', abortOnFail: false }],
      [clock]: ['max>=0'],
    },
    summaryTrendStats: TREND_STATS,
    systemTags: SYSTEM_TAGS,
  };
}

// rest.js's http.batch options for STREAMS > 1: all STREAMS requests at once to the one host (k6's
// defaults, batch 20 and batchPerHost 6, would hold some back); none for STREAMS=1, k6's defaults.
export function batchOptions() {
  if (STREAMS === 1) return {};
  return { batch: Math.max(20, STREAMS), batchPerHost: STREAMS };
}

// Check functions for decoded records: COUNT of them, each with every field of the shape's record
// (cars: every Car and Driver field). grpcDefaults: k6 may drop proto3 zero-valued numbers from
// decoded gRPC messages (it does for stream messages), and on the wire an absent number is 0, so
// a number may be absent; k6 decodes gRPC's int64 as a string of digits (the protobuf JSON mapping).
export function recordChecks(records, grpcDefaults) {
  const list = Array.isArray(records) ? records : [];
  const fields = RECORD_FIELDS[SHAPE];
  const valid = (rec) => fields(rec, grpcDefaults);
  return {
    'record count == COUNT': () => list.length === COUNT,
    'record fields present': () => list.length > 0 && list.every(valid),
  };
}

const NUMERIC_INTS = [
  'id', 'timestampMs', 'sequence', 'accountId', 'quantity', 'volume', 'openInterest', 'tradeCount',
];
const NUMERIC_DOUBLES = ['price', 'bid', 'ask', 'open', 'high', 'low', 'close', 'vwap'];
const TEXT_STRINGS = ['title', 'author', 'language', 'slug', 'body'];

function isObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}
const numberOr = (grpcDefaults) => (v) => typeof v === 'number' || (grpcDefaults && v === undefined);
const int64Or = (grpcDefaults) => (v) =>
  typeof v === 'number' || (typeof v === 'string' && /^-?\d+$/.test(v)) || (grpcDefaults && v === undefined);

const RECORD_FIELDS = {
  cars: hasAllFields,
  numeric: (rec, grpcDefaults) => isObject(rec) &&
    NUMERIC_INTS.every((f) => int64Or(grpcDefaults)(rec[f])) &&
    NUMERIC_DOUBLES.every((f) => numberOr(grpcDefaults)(rec[f])),
  text: (rec) => isObject(rec) && TEXT_STRINGS.every((f) => isString(rec[f])),
  // The user's message: any object (the runner verified its records before measuring, by checksum).
  proto: isObject,
  nested: (rec, grpcDefaults) => isObject(rec) && isString(rec.orderId) &&
    Array.isArray(rec.items) && rec.items.length > 0 &&
    rec.items.every((item) => isObject(item) && isString(item.sku) &&
      numberOr(grpcDefaults)(item.quantity) && numberOr(grpcDefaults)(item.price)) &&
    isObject(rec.attributes) && Object.values(rec.attributes).every(isString),
};

const CAR_STRINGS = ['make', 'model', 'trim', 'color'];
const CAR_NUMBERS = ['year', 'mileage'];
const DRIVER_STRINGS = ['firstname', 'lastname', 'driverId'];

const isString = (v) => typeof v === 'string';

function hasAllFields(rec, grpcDefaults) {
  if (rec === null || typeof rec !== 'object' || !rec.car || !rec.driver) return false;
  const isNumber = (v) => typeof v === 'number' || (grpcDefaults && v === undefined);
  return (
    CAR_STRINGS.every((f) => isString(rec.car[f])) &&
    CAR_NUMBERS.every((f) => isNumber(rec.car[f])) &&
    DRIVER_STRINGS.every((f) => isString(rec.driver[f]))
  );
}

function stat(data, metric, key) {
  const m = data.metrics[metric];
  return m && m.values[key] !== undefined ? m.values[key] : 0;
}

function thresholdsOk(data) {
  return Object.values(data.metrics).every(
    (m) => !m.thresholds || Object.values(m.thresholds).every((t) => t.ok),
  );
}

// handleSummary for a script whose latency clock is `latencyMetric`: one stdout line, and the
// full summary JSON at SUMMARY_FILE (when set) with protolab.latency_metric naming the clock.
// The clock is k6's own timer of each undecoded request on every protocol, never a JavaScript
// window: REST's http_req_duration (sending + waiting + receiving), gRPC's grpc_req_duration (the
// call, or the whole stream, on the wire).
export function summaryHandler(latencyMetric) {
  return function handleSummary(data) {
    const line =
      `protolab: ok_reqs=${stat(data, 'protolab_reqs', 'count')} ` +
      `(${stat(data, 'protolab_reqs', 'rate').toFixed(1)}/s) ` +
      `failed=${(100 * stat(data, 'protolab_req_failed', 'rate')).toFixed(2)}% ` +
      `p50=${stat(data, latencyMetric, 'p(50)').toFixed(3)}ms ` +
      `p99=${stat(data, latencyMetric, 'p(99)').toFixed(3)}ms ` +
      `checks=${(100 * stat(data, 'checks', 'rate')).toFixed(2)}% ` +
      `dropped=${stat(data, 'dropped_iterations', 'count')} ` +
      `thresholds=${thresholdsOk(data) ? 'ok' : 'FAILED'}\n`;
    const out = { stdout: line };
    const file = __ENV.SUMMARY_FILE;
    if (file) {
      out[file] = JSON.stringify(Object.assign({ protolab: { latency_metric: latencyMetric } }, data), null, 2);
    }
    return out;
  };
}

// gRPC client with cars.proto (every shape's messages and services) loaded from PROTO_DIR (relative paths resolve against the
// script's folder), or the descriptor set PROTOSET of the user's own message; call from a script's init context.
export function grpcClient() {
  const client = new grpc.Client();
  if (SHAPE === 'proto') client.loadProtoset(envString('PROTOSET'));
  else client.load([envString('PROTO_DIR', '../proto')], 'cars.proto');
  return client;
}

// An upload's records, count and checksum (CreateRecords, UploadRecords; restUpload adds the body's
// bytes), or null when UPLOAD_FILE is unset.
// UPLOAD_FILE: an absolute path to {"records": [...]} in the proto's canonical JSON names (the REST
// body), written by the runner before the run; UPLOAD_COUNT: how many records it holds (checked;
// default: as many as it holds). Read and parsed once per VU, here in init: every request sends these
// same objects, which k6 marshals per request. checksum: what the server's reply must say (the
// shape's, services/common/shapes.py: UPLOAD_CHECKSUMS below computes the same; JavaScript's string
// length is Python's for the pool's characters, all in the Basic Multilingual Plane).
export function uploadFile() {
  const file = __ENV.UPLOAD_FILE;
  if (!file) return null;
  const records = JSON.parse(open(file)).records;
  const count = envInt('UPLOAD_COUNT', records.length);
  if (records.length !== count) {
    throw new Error(`protolab: ${file} holds ${records.length} records, UPLOAD_COUNT=${count}`);
  }
  return { records, count, checksum: UPLOAD_CHECKSUMS[SHAPE](records) };
}

// Each shape's checksum of an upload's records, as services/common/shapes.py computes it: summed
// modulo 2**32 record by record, each int64 first reduced modulo 2**32, so that no sum passes 2**53,
// where a JavaScript number stops being exact (the pool's numbers are all >= 0). (|| 0: the proto's
// JSON mapping may leave a zero number out.)
const MOD = 2 ** 32;
const UPLOAD_CHECKSUMS = {
  // The user's message: what the runner computed from the same file (UPLOAD_CHECKSUM; its CRC-32 of
  // the decoded records has no JavaScript twin here).
  proto: () => envInt('UPLOAD_CHECKSUM'),
  cars: (records) => {
    let total = 0;
    for (const { car, driver } of records) {
      total += (car.year || 0) + (car.mileage || 0) + car.make.length + car.model.length + car.trim.length +
        car.color.length + driver.firstname.length + driver.lastname.length + driver.driverId.length;
    }
    return total % MOD;
  },
  numeric: (records) => {
    let total = 0;
    for (const rec of records) {
      for (const f of NUMERIC_INTS) total = (total + (Number(rec[f] || 0) % MOD)) % MOD;
      // the pool's doubles have three decimals: read in thousandths, as integers
      for (const f of NUMERIC_DOUBLES) total = (total + Math.round((rec[f] || 0) * 1000)) % MOD;
    }
    return total;
  },
  text: (records) => {
    let total = 0;
    for (const rec of records) {
      for (const f of TEXT_STRINGS) total += rec[f].length;
    }
    return total % MOD;
  },
  nested: (records) => {
    let total = 0;
    for (const { orderId, items, attributes } of records) {
      total += orderId.length;
      // the pool's prices have two decimals: read in hundredths, as integers
      for (const item of items) total += item.sku.length + (item.quantity || 0) + Math.round((item.price || 0) * 100);
      for (const [key, value] of Object.entries(attributes)) total += key.length + value.length;
      total %= MOD;
    }
    return total;
  },
};

// Checks of a decoded CreateRecordsReply (none: {}) against the upload sent.
export function uploadReplyChecks(reply, upload) {
  const got = reply || {};
  return {
    'reply count == records sent': () => got.count === upload.count,
    'reply checksum == records sent': () => got.checksum === upload.checksum,
  };
}

// A REST upload (POST /records), or null when UPLOAD_FILE is unset: body, the file's exact bytes,
// sent as they are by every request (read once per VU, here in init), and the count and checksum
// the reply must say (uploadFile's, from the same file).
export function restUpload() {
  const upload = uploadFile();
  if (upload === null) return null;
  return { body: open(__ENV.UPLOAD_FILE, 'b'), count: upload.count, checksum: upload.checksum };
}

// The VU's calls on its current connection (each VU has its own JS runtime, so this is per VU):
// 0 before its first, and again once CHURN calls have ended one.
let callsOnConnection = 0;

// REST: counts one request of the VU, and says whether it must carry Connection: close, the
// CHURN-th on its connection: k6 then closes that connection after the response and dials a new one
// for the next request (over HTTP/2 on the request's header alone; over HTTP/1.1 when the response
// says Connection: close too, as every lab server's does: docs/CONTRACTS.md). The VU's first request,
// and the next after one that closed, open a connection: protolab_connections counts them.
export function requestCloses() {
  if (callsOnConnection === 0) connections.add(1);
  callsOnConnection += 1;
  if (CHURN === null || callsOnConnection < CHURN) return false;
  callsOnConnection = 0;
  return true;
}

// gRPC: whether the VU's client is connected.
let connected = false;

// gRPC, after a call has ended: closes the VU's connection once CHURN calls were made on it (the next
// call connects again).
export function closeIfChurned(client) {
  if (!connected || CHURN === null || callsOnConnection < CHURN) return;
  client.close();
  connected = false;
}

// gRPC, before each call (an iteration's): closes a connection churned and not yet closed (a stream's:
// its iteration's stream has ended, and every event of it, as k6 started this iteration), connects the
// client when it is not (the VU's first call, and the first after a churn), and counts the call on the
// connection. Each connect that succeeds counts one in protolab_connections; a failed one counts as a
// failed request.
export function connectForCall(client) {
  closeIfChurned(client);
  if (!connected) {
    try {
      client.connect(envString('GRPC_ADDR'), { plaintext: !TLS, timeout: '10s' });
    } catch (e) {
      record(false);
      throw e;
    }
    connected = true;
    callsOnConnection = 0;
    connections.add(1);
  }
  callsOnConnection += 1;
}
