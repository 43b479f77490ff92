// Shardyard dashboard: the teams' queues (the monitor's /api/queues), loaded after dom.js and dashboard.js. One row
// per queue and GPU model: its nominal quota and the GPUs its running jobs use, borrow from its cohort and lend to
// it, the GPUs its waiting jobs ask for, its pending jobs and its fair share (the weighted dominant share: the queue
// with the lowest goes first). A queue waiting for its nominal quota is marked starving, since when.
"use strict";

const QUEUES_POLL_MS = 2000;

function queueRows(queue) {
  const models = Object.entries(queue.models);
  if (!models.length) models.push(["—", {}]);
  return models.map(([model, use], i) => h("tr", { "data-queue": queue.queue, "data-model": model },
    h("td", { class: "mono" }, i === 0 ? queue.queue : ""),
    h("td", {}, i === 0 ? queue.cohort ?? "—" : ""),
    h("td", {}, model),
    ...["nominal", "used", "borrowed", "lent", "pending"].map((kind) => h("td", { class: "num" }, use[kind] ?? "—")),
    h("td", { class: "num" }, i === 0 ? queue.pending_jobs : ""),
    h("td", { class: "num" }, i === 0 ? num(queue.fair_share, 3) : ""),
    h("td", {}, i === 0 && queue.starving_since ? badge(`starving since ${clock(queue.starving_since)}`, "bad") : ""),
  ));
}

function renderQueues(answer) {
  const box = document.getElementById("queues");
  if (answer.error) return box.replaceChildren(empty(`queues unavailable: ${answer.error}`));
  const note = answer.configured
    ? `queues file ${answer.source}, version ${String(answer.version).slice(0, 12)}`
    : "no queues file in force: one queue, no quotas";
  const names = ["queue", "cohort", "model", "nominal", "used", "borrowed", "lent", "pending GPUs", "pending jobs",
    "share", ""];
  const numeric = new Set(["nominal", "used", "borrowed", "lent", "pending GPUs", "pending jobs", "share"]);
  const head = h("thead", {}, h("tr", {}, names.map((n) => h("th", { class: numeric.has(n) ? "num" : "" }, n))));
  box.replaceChildren(h("div", { class: "meta" }, note),
    h("table", {}, head, h("tbody", {}, answer.queues.flatMap(queueRows))));
}

async function pollQueues() {
  try {
    renderQueues(await getJson("api/queues"));
  } catch (error) {
    renderQueues({ error: error.message });
  } finally {
    setTimeout(pollQueues, QUEUES_POLL_MS);
  }
}

pollQueues();
