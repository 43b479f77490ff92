// Shardyard dashboard. Polls the monitor's JSON API every second and redraws the page from what it gets:
// the cluster summary, firing alerts, nodes with their GPUs, the job list, and the selected job with its curves and
// timeline. Plain JavaScript and inline SVG: no framework, no build step, nothing fetched from outside the monitor.
//
// Every piece of text goes in through textContent, never innerHTML: job ids, messages and node labels come from
// users and agents.
"use strict";

const POLL_MS = 1000;
const MAX_JOB_ROWS = 200;
const MAX_NODE_CARDS = 200;
const STATE_ORDER = [
  "RUNNING", "SCHEDULED", "READY", "WAITING", "ACCEPTED", "FAILED", "CANCELLED", "SUCCEEDED", "REJECTED",
];
const STATE_TONE = {
  RUNNING: "ok", SCHEDULED: "info", READY: "warn", WAITING: "warn", ACCEPTED: "warn",
  SUCCEEDED: "ok", FAILED: "bad", REJECTED: "bad", CANCELLED: "",
  ALIVE: "ok", SUSPECT: "warn", LOST: "bad",
  critical: "bad", error: "bad", page: "bad", warning: "warn", info: "info",
};
// --- the API ---------------------------------------------------------------------------------------------------

/** The monitor's read token, when the page was opened as ``/?token=...`` (an API beyond this host needs it). */
const READ_TOKEN = new URLSearchParams(location.search).get("token");

async function getJson(path) {
  const headers = READ_TOKEN ? { Authorization: `Bearer ${READ_TOKEN}` } : {};
  const response = await fetch(path, { cache: "no-store", headers });
  if (!response.ok) {
    const error = new Error(`${path}: HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return response.json();
}

/** Firing alerts (``{"firing": [...]}``, the alert.firing events), null while the monitor serves no alerts (404),
 * or the error: the rest of the page works without them. */
async function fetchAlerts() {
  try {
    const body = await getJson("api/alerts");
    const all = Array.isArray(body) ? body : body.firing ?? body.alerts ?? [];
    const firing = (alert) => !alert.state || /firing|active/i.test(alert.state);
    return all.filter((alert) => alert.type !== "alert.resolved" && firing(alert));
  } catch (error) {
    return error.status === 404 ? null : { error: error.message };
  }
}

// --- sections --------------------------------------------------------------------------------------------------

function tile(label, value, note) {
  return h("div", { class: "tile" }, h("div", { class: "value" }, value), h("div", { class: "label" }, label),
    note ? h("div", { class: "note" }, note) : null);
}

function renderSummary(summary) {
  const jobs = summary.jobs;
  const nodes = summary.nodes;
  const pending = jobs.ACCEPTED + jobs.WAITING + jobs.READY;
  document.getElementById("summary").replaceChildren(
    tile("running jobs", jobs.RUNNING + jobs.SCHEDULED, `${jobs.SCHEDULED} starting`),
    tile("pending jobs", pending, `${jobs.WAITING} waiting`),
    tile("succeeded", jobs.SUCCEEDED),
    tile("failed", jobs.FAILED + jobs.REJECTED, `${jobs.REJECTED} rejected, ${jobs.CANCELLED} cancelled`),
    tile("nodes alive", nodes.ALIVE, `${nodes.SUSPECT} suspect, ${nodes.LOST} lost, ${summary.draining} draining`),
    tile("GPUs in use", `${summary.gpus_allocated} / ${summary.gpus}`,
      summary.gpus_unhealthy ? `${summary.gpus_unhealthy} unhealthy` : "all healthy"),
    tile("GPU utilisation", pct(summary.gpu_utilization), "mean over all GPUs"),
    tile("spare ratio", pct(summary.spare_ratio), `failure rate ${pct(summary.failure_rate)}`),
    tile("recoveries", summary.recoveries, `${summary.preemptions} preemptions`),
    tile("dead letters", summary.dead_letters),
  );
}

function renderAlerts(alerts) {
  const box = document.getElementById("alerts");
  if (alerts === null) return box.replaceChildren(empty("alert rules are not served by this monitor yet"));
  if (alerts.error) return box.replaceChildren(empty(`alerts unavailable: ${alerts.error}`));
  if (!alerts.length) return box.replaceChildren(empty("no alerts firing"));
  box.replaceChildren(...alerts.map((alert) => {
    const labels = alert.labels ?? {};
    const severity = alert.severity ?? labels.severity ?? "warning";
    const name = alert.name ?? alert.alertname ?? alert.rule ?? labels.alertname ?? "alert";
    const subject = alert.subject ?? alert.job_id ?? alert.node_id ?? labels.job ?? labels.node ?? "";
    const message = alert.message ?? alert.summary ?? alert.description ?? alert.annotations?.summary ?? "";
    const since = alert.since ?? alert.started_at ?? alert.firing_since ?? alert.active_at ?? alert.occurred_at;
    return h("div", { class: "alert" },
      h("div", { class: "alert-head" }, badge(severity, STATE_TONE[String(severity).toLowerCase()]),
        h("span", { class: "what" }, name), subject ? h("span", { class: "mono" }, subject) : null,
        since ? h("span", { class: "since", title: since }, `since ${clock(since)}`) : null),
      message ? h("div", { class: "why" }, message) : null);
  }));
}

function gpuRow(gpu, allocated) {
  const memory = gpu.memory_bytes ? gpu.memory_used_bytes / gpu.memory_bytes : 0;
  return h("tr", {},
    h("td", { class: "mono" }, `GPU ${gpu.index}`),
    h("td", {}, `${gpu.model} · ${num(gpu.tflops)} TF${gpu.simulated ? " (sim)" : ""}`),
    h("td", { title: "utilisation" }, bar(gpu.utilization)),
    h("td", { class: "num" }, pct(gpu.utilization)),
    h("td", { class: "num", title: `memory in use: ${pct(memory)}` },
      `${gib(gpu.memory_used_bytes)} / ${gib(gpu.memory_bytes)}`),
    h("td", { class: "num", title: "temperature" },
      gpu.temperature_c == null ? "—" : `${Math.round(gpu.temperature_c)}°C`),
    h("td", {}, !gpu.healthy ? badge("faulty", "bad") : allocated ? badge("in use", "info") : badge("free", "")),
  );
}

function nodeCard(node) {
  const allocated = new Set(node.allocated_gpus);
  const where = Object.values(node.topology).join(" / ");
  const shards = node.running.map((r) => `${r.job_id}#${r.shard_index}`).join(", ");
  return h("div", { class: `node ${node.status}`, "data-node-id": node.node_id },
    h("div", { class: "node-head" },
      h("span", { class: "name mono" }, node.node_id), badge(node.status),
      node.draining ? badge("draining", "warn") : null,
      h("span", { class: "meta" }, [where, `heartbeat ${ago(node.last_heartbeat_at)}`].filter(Boolean).join(" · "))),
    h("div", { class: "gauge" },
      h("span", {}, "CPU load"), bar(node.cpu_load), h("span", { class: "num" }, pct(node.cpu_load))),
    h("div", { class: "meta" }, `${num(node.cpu_cores)} cores · ${gib(node.memory_bytes)} RAM`,
      shards ? ` · running ${shards}` : ""),
    h("table", { class: "gpus" }, h("tbody", {}, node.gpus.map((gpu) => gpuRow(gpu, allocated.has(gpu.index))))),
    node.gpus.filter((g) => g.fault).map((g) => h("div", { class: "why" }, `GPU ${g.index}: ${g.fault}`)),
  );
}

function renderNodes(nodes) {
  const box = document.getElementById("nodes");
  if (!nodes.length) return box.replaceChildren(empty("no node has reported yet"));
  const cards = nodes.slice(0, MAX_NODE_CARDS).map(nodeCard);
  const more = nodes.length > MAX_NODE_CARDS ? empty(`and ${nodes.length - MAX_NODE_CARDS} more nodes`) : null;
  box.replaceChildren(...cards, ...(more ? [more] : []));
}

/** Active jobs first (by lifecycle stage), then ended ones; newest submission first within each state. */
function sortJobs(jobs) {
  const rank = (job) => { const i = STATE_ORDER.indexOf(job.state); return i < 0 ? STATE_ORDER.length : i; };
  return [...jobs].sort((a, b) => rank(a) - rank(b) || String(b.submitted_at).localeCompare(String(a.submitted_at)));
}

function selectedJobId(sorted) {
  const match = /(?:^#|&)job=([^&]+)/.exec(location.hash);
  if (match) return decodeURIComponent(match[1]);
  return sorted.length ? sorted[0].job_id : null;
}

function select(jobId) {
  location.hash = `job=${encodeURIComponent(jobId)}`;
}

function progressCell(job) {
  if (!job.max_steps) return h("td", { class: "num" }, job.step || "—");
  return h("td", {}, h("div", { class: "gauge" }, h("span", { class: "num" }, `${job.step}/${job.max_steps}`),
    bar(job.step / job.max_steps, "progress"), h("span", { class: "num" }, pct(job.step / job.max_steps))));
}

function renderJobs(sorted, selected) {
  const box = document.getElementById("jobs");
  if (!sorted.length) return box.replaceChildren(empty("no job submitted yet"));
  const rows = sorted.slice(0, MAX_JOB_ROWS).map((job) => h("tr",
    { class: job.job_id === selected ? "selected" : "", "data-job-id": job.job_id, onclick: () => select(job.job_id) },
    h("td", { class: "mono" }, job.job_id),
    h("td", {}, badge(job.state)),
    h("td", { class: "num" }, job.priority ?? "—"),
    h("td", {}, job.gpus ?? "—"),
    progressCell(job),
    h("td", { class: "num" }, num(job.loss, 4)),
    h("td", { class: "why" }, [job.reason, job.message].filter(Boolean).join(": ")),
  ));
  const head = h("thead", {}, h("tr", {}, ["job", "state", "prio", "GPUs", "step", "loss", "why"].map(
    (name) => h("th", { class: ["prio", "loss"].includes(name) ? "num" : "" }, name))));
  const more = sorted.length > MAX_JOB_ROWS ? empty(`and ${sorted.length - MAX_JOB_ROWS} more jobs`) : null;
  box.replaceChildren(h("table", {}, head, h("tbody", {}, rows)), ...(more ? [more] : []));
}

// --- charts ----------------------------------------------------------------------------------------------------

/** About ``count`` round tick values (1, 2 or 5 times a power of ten) covering lo..hi. */
function ticks(lo, hi, count) {
  const raw = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((candidate) => candidate >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

/** A line chart as inline SVG: the curve is one polyline, its last point marked and labelled. Points without a
 * number (a diverged loss comes as null) are left out. */
function lineChart({ id, title, xs: allXs, ys: allYs, xLabel }) {
  const kept = allXs.map((x, i) => [x, allYs[i]]).filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
  const [xs, ys] = [kept.map(([x]) => x), kept.map(([, y]) => y)];
  const W = 460, H = 200, L = 52, R = 12, T = 10, B = 30;
  const chart = s("svg", { id, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title, "data-points": xs.length });
  const figure = h("div", { class: "chart" }, h("h3", {}, title), chart);
  if (!xs.length) {
    chart.append(s("text", { class: "none", x: W / 2, y: H / 2, "text-anchor": "middle" }, "no progress reported yet"));
    return figure;
  }
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) x1 = x0 + 1;
  const pad = (y1 - y0) * 0.08 || Math.abs(y1) * 0.1 || 1;
  [y0, y1] = [y0 - pad, y1 + pad];
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  for (const y of ticks(y0, y1, 4)) {
    chart.append(s("line", { class: "grid", x1: L, x2: W - R, y1: py(y), y2: py(y) }),
      s("text", { class: "tick", x: L - 6, y: py(y) + 3, "text-anchor": "end" }, num(y)));
  }
  for (const x of ticks(x0, x1, 5)) {
    chart.append(s("text", { class: "tick", x: px(x), y: H - B + 14, "text-anchor": "middle" }, num(x)));
  }
  const points = xs.map((x, i) => `${px(x).toFixed(1)},${py(ys[i]).toFixed(1)}`).join(" ");
  const [lastX, lastY] = [px(xs.at(-1)), py(ys.at(-1))];
  chart.append(
    s("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }),
    s("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }),
    s("text", { class: "tick", x: (L + W - R) / 2, y: H - 3, "text-anchor": "middle" }, xLabel),
    s("polyline", { class: "curve", points }),
    s("circle", { class: "last", cx: lastX, cy: lastY, r: 3 }),
    s("text", { class: "tick", x: Math.min(lastX, W - R - 4), y: Math.max(lastY - 7, T + 8), "text-anchor": "end" },
      num(ys.at(-1), 4)),
  );
  return figure;
}

// --- the selected job ------------------------------------------------------------------------------------------

function fact(label, value) {
  return value === null || value === undefined || value === "" ? null : h("span", {}, `${label} `, h("b", {}, value));
}

/** Each rank's own time a step over the median of the others' (a straggler's is far above 1): as the STRAGGLER
 * rule judges it, from the ranks' newest reports. */
function ownTimeRatios(shards) {
  const own = Object.entries(shards).filter(([, s]) => s.compute_ms > 0).map(([i, s]) => [i, s.compute_ms]);
  const median = (xs) => {
    const v = [...xs].sort((a, b) => a - b);
    const m = v.length >> 1;
    return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
  };
  return new Map(own.map(([i, ms]) => {
    const others = own.filter(([j]) => j !== i).map(([, v]) => v);
    return [i, others.length ? ms / median(others) : null];
  }));
}

function shardsTable(detail) {
  const placed = new Map(detail.placements.map((p) => [String(p.shard_index), p]));
  const ratios = ownTimeRatios(detail.shards);
  const slow = (index) => (ratios.get(index) ?? 0) >= 1.4;
  const gpuOf = (p) => (p ? `GPU ${p.gpu_indices.join(",")} ${p.gpu_model}${p.degraded ? " (degraded)" : ""}` : "—");
  const rows = Object.entries(detail.shards).map(([index, shard]) => h("tr", {},
    h("td", { class: "num" }, index),
    h("td", { class: "mono" }, shard.node_id),
    h("td", {}, gpuOf(placed.get(index))),
    h("td", {}, badge(shard.state, { RUNNING: "ok", COMPLETED: "ok", FAILED: "bad" }[shard.state] ?? "info")),
    h("td", { class: "num" }, shard.step ?? "—"),
    h("td", { class: "num" }, num(shard.loss, 4)),
    h("td", { class: "num" }, num(shard.samples_per_s)),
    h("td", { class: "num" }, shard.step_ms > 0 ? `${num(shard.step_ms)} ms` : "—"),
    h("td", { class: slow(index) ? "num bad" : "num" }, shard.compute_ms > 0
      ? `${num(shard.compute_ms)} ms${ratios.get(index) ? ` (${ratios.get(index).toFixed(2)}x)` : ""}` : "—"),
    h("td", { class: "num" }, shard.allreduce_ms == null ? "—" : `${num(shard.allreduce_ms)} ms`),
    h("td", { class: "num" }, shard.syncs ?? "—"),
    h("td", { class: "num" }, shard.cpu_percent == null ? "—" : `${Math.round(shard.cpu_percent)}%`),
    h("td", { class: "why" }, shard.cause ?? ""),
  ));
  if (!rows.length) return empty("no shard has started");
  const names = ["shard", "node", "GPU", "state", "step", "loss", "samples/s", "step time", "own time", "AllReduce",
    "syncs", "CPU", "cause"];
  const numeric = new Set(["shard", "step", "loss", "samples/s", "step time", "own time", "AllReduce", "syncs", "CPU"]);
  const head = h("thead", {}, h("tr", {}, names.map((n) => h("th", { class: numeric.has(n) ? "num" : "" }, n))));
  return h("table", {}, head, h("tbody", {}, rows));
}

const MAX_LINK_ROWS = 20;

/** The gang's links (every pair among the nodes its shards are placed on), worst first as the monitor sends them:
 * measured RTT and bandwidth where the agents probed the pair, else the topology estimate; slow ones marked. */
function linksTable(links) {
  if (!links?.length) return empty("no links: the gang is on one node, or not placed");
  const mbps = (bytes) => (bytes == null ? "—" : `${num(bytes / 1e6)} MB/s`);
  const rows = links.slice(0, MAX_LINK_ROWS).map((link) => h("tr",
    { class: link.slow ? "slow-link" : "", "data-link": `${link.a}|${link.b}` },
    h("td", { class: "mono" }, `${link.a} ↔ ${link.b}`),
    h("td", { class: "num" }, link.rtt_ms == null ? "—" : `${num(link.rtt_ms)} ms`),
    h("td", { class: "num" }, link.rtt_p90_ms == null ? "—" : `${num(link.rtt_p90_ms)} ms`),
    h("td", { class: "num" }, mbps(link.bandwidth_bytes_per_s)),
    h("td", {}, link.source === "measured" ? `measured ${ago(link.measured_at)}` : link.source),
    h("td", {}, link.slow ? badge("slow", "bad") : null, link.why ? h("span", { class: "why" }, ` ${link.why}`) : null),
  ));
  const head = h("thead", {}, h("tr", {}, ["link", "RTT", "p90", "bandwidth", "source", ""].map(
    (name) => h("th", { class: ["RTT", "p90", "bandwidth"].includes(name) ? "num" : "" }, name))));
  const more = links.length > MAX_LINK_ROWS ? empty(`and ${links.length - MAX_LINK_ROWS} more links`) : null;
  return h("div", { id: "gang-links" }, h("table", {}, head, h("tbody", {}, rows)), more);
}

function timelineTable(timeline) {
  const rows = [...timeline].reverse().map((entry) => h("tr", {},
    h("td", { title: entry.at }, clock(entry.at)), h("td", {}, entry.event), h("td", {}, entry.detail)));
  return h("div", { id: "timeline" }, rows.length ? h("table", {}, h("tbody", {}, rows)) : empty("nothing yet"));
}

/** "~14:05, 90 % by 14:30": a job waiting on capacity starts about then (the median of the scheduler's estimate),
 * and by the second time in 90 % of its plan's samples; null when it carries no estimate. */
function startEstimate(detail) {
  if (!detail.estimated_start) return null;
  const p90 = detail.estimated_start_p90 ? `, 90 % by ${hhmm(detail.estimated_start_p90)}` : "";
  return `~${hhmm(detail.estimated_start)}${p90}`;
}

function renderDetail(detail, series) {
  const box = document.getElementById("job-detail");
  const keepScroll = document.getElementById("timeline")?.scrollTop ?? 0;
  const why = [detail.reason, detail.message].filter(Boolean).join(": ");
  const counts = Object.entries(detail.node_counts ?? {}).map(([filter, n]) => `${n} ${filter}`).join(", ");
  box.replaceChildren(
    h("div", { class: "detail-head" },
      h("span", { class: "name mono", id: "detail-job-id" }, detail.job_id), badge(detail.state),
      detail.degraded ? badge("degraded", "warn") : null,
      why ? h("span", { class: "why" }, why) : null),
    h("div", { class: "facts" },
      fact("GPUs", detail.gpus), fact("priority", detail.priority), fact("attempt", detail.attempt || null),
      fact("step", detail.max_steps ? `${detail.step} / ${detail.max_steps}` : detail.step),
      fact("loss", detail.first_loss == null ? null : `${num(detail.first_loss, 4)} → ${num(detail.loss, 4)}`),
      fact("final loss", detail.final_loss == null ? null : num(detail.final_loss, 4)),
      fact("recoveries", detail.recoveries || null),
      fact("checkpoint", detail.last_checkpoint ? `step ${detail.last_checkpoint.step}` : null),
      fact("first step", detail.first_step_at ? clock(detail.first_step_at) : null),
      fact("ended", detail.ended_at ? clock(detail.ended_at) : null),
      fact("waiting for", detail.waiting_for?.join(", ")),
      fact("starts", startEstimate(detail)),
      fact("nodes ruled out", counts)),
    h("div", { class: "charts" },
      lineChart({ id: "loss-chart", title: "loss", xs: series.step, ys: series.loss, xLabel: "step" }),
      lineChart({
        id: "rate-chart", title: "throughput (samples/s, whole gang)", xs: series.t_s, ys: series.samples_per_s,
        xLabel: "seconds since the first step",
      })),
    h("h4", {}, "goodput"), goodputSection(detail.goodput),
    h("h4", {}, "shards"), shardsTable(detail),
    h("h4", {}, "gang links"), linksTable(detail.links),
    h("h4", {}, "timeline (newest first)"), timelineTable(detail.timeline),
  );
  document.getElementById("timeline").scrollTop = keepScroll;
}

// --- the loop --------------------------------------------------------------------------------------------------

function setConnection(error) {
  const line = document.getElementById("connection");
  line.className = error ? "down" : "";
  line.textContent = error
    ? `monitor unreachable (${error.message}); retrying every ${POLL_MS / 1000} s`
    : `live · updated ${clock(new Date().toISOString())}`;
}

async function refresh() {
  const [summary, nodes, jobs, alerts] = await Promise.all(
    [getJson("api/summary"), getJson("api/nodes"), getJson("api/jobs"), fetchAlerts()]);
  const sorted = sortJobs(jobs.jobs);
  const selected = selectedJobId(sorted);
  renderSummary(summary);
  renderAlerts(alerts);
  renderNodes(nodes.nodes);
  renderJobs(sorted, selected);
  if (!selected) return document.getElementById("job-detail").replaceChildren(empty("no job to show"));
  const path = `api/jobs/${encodeURIComponent(selected)}`;
  try {
    const [detail, series] = await Promise.all([getJson(path), getJson(`${path}/series`)]);
    renderDetail(detail, series);
  } catch (error) {
    if (error.status !== 404) throw error;
    document.getElementById("job-detail").replaceChildren(empty(`no job ${selected} (yet)`));
  }
}

/** One refresh at a time: the next starts a second after the last ended, so a slow monitor is never piled on. */
async function poll() {
  try {
    await refresh();
    setConnection(null);
  } catch (error) {
    setConnection(error);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

window.addEventListener("hashchange", () => refresh().catch(setConnection));
poll();
