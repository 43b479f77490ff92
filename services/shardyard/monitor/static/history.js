// Shardyard dashboard: the job history, from the accounting database (the monitor's /api/history), loaded after
// dom.js and dashboard.js. The live job list above shows what the log holds; this table shows what the database
// holds, jobs of earlier clusters too: result, wait, run time, GPU-hours, attempts and the one final loss (rank 0's,
// of the attempt that succeeded). Polled every HISTORY_POLL_MS; its state filter is the API's `state` parameter.
"use strict";

const HISTORY_POLL_MS = 5000;
const HISTORY_ROWS = 50;
const HISTORY_STATES = ["", "SUCCEEDED", "FAILED", "CANCELLED", "RUNNING", "READY"];

/** ``45s``, ``12m05s``, ``3h07m``, as ``shardyard history`` prints them. */
function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const whole = Math.round(seconds);
  if (whole < 60) return `${whole}s`;
  if (whole < 3600) return `${Math.floor(whole / 60)}m${String(whole % 60).padStart(2, "0")}s`;
  return `${Math.floor(whole / 3600)}h${String(Math.floor((whole % 3600) / 60)).padStart(2, "0")}m`;
}

/** A date and time (the history spans days, not the last minutes): ``2026-05-01 12:00:03``, local time. */
function when(iso) {
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return String(iso ?? "—");
  const pad = (n) => String(n).padStart(2, "0");
  return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())} ${clock(iso)}`;
}

function historyRow(job) {
  return h("tr", { "data-history-job": job.job_id, "data-state": job.state },
    h("td", { class: "mono" }, job.job_id),
    h("td", {}, badge(job.state)),
    h("td", {}, [job.team, job.queue].filter(Boolean).join(" / ") || "—"),
    h("td", {}, `${job.gpus} × ${job.gpu_model ?? "any"}`),
    h("td", { title: job.submitted_at, class: "mono" }, when(job.submitted_at)),
    h("td", { class: "num" }, duration(job.wait_s)),
    h("td", { class: "num" }, duration(job.run_s)),
    h("td", { class: "num" }, num(job.gpu_hours, 3)),
    h("td", { class: "num" }, job.attempts),
    h("td", { class: "num" }, num(job.final_loss, 4)),
    h("td", { class: "why" }, [job.reason, job.message].filter(Boolean).join(": ")),
  );
}

function historyFilter() {
  const current = document.getElementById("history-state")?.value ?? "";
  const select = h("select", { id: "history-state", "aria-label": "state", onchange: () => refreshHistory() },
    HISTORY_STATES.map((state) => h("option", { value: state, selected: state === current }, state || "every state")));
  return h("div", { class: "meta" }, "show ", select);
}

function renderHistory(answer) {
  const box = document.getElementById("history");
  const filter = historyFilter();
  if (answer.error) return box.replaceChildren(filter, empty(`history unavailable: ${answer.error}`));
  if (!answer.jobs.length) return box.replaceChildren(filter, empty("no job recorded yet"));
  const names = ["job", "result", "team / queue", "GPUs", "submitted", "wait", "run", "GPU-h", "attempts",
    "final loss", "reason"];
  const numeric = new Set(["wait", "run", "GPU-h", "attempts", "final loss"]);
  const head = h("thead", {}, h("tr", {}, names.map((n) => h("th", { class: numeric.has(n) ? "num" : "" }, n))));
  box.replaceChildren(filter, h("table", {}, head, h("tbody", {}, answer.jobs.map(historyRow))));
}

async function refreshHistory() {
  const state = document.getElementById("history-state")?.value ?? "";
  const query = new URLSearchParams({ limit: String(HISTORY_ROWS), ...(state ? { state } : {}) });
  try {
    renderHistory(await getJson(`api/history?${query}`));
  } catch (error) {
    // 503: no accounting database, or not yet; the body says which.
    let message = error.message;
    if (error.status === 503) message = "the monitor has no accounting database (yet)";
    renderHistory({ error: message });
  }
}

async function pollHistory() {
  try {
    await refreshHistory();
  } finally {
    setTimeout(pollHistory, HISTORY_POLL_MS);
  }
}

pollHistory();
