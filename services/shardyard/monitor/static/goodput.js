// Shardyard dashboard: a job's goodput ledger (the ``goodput`` of /api/jobs/JOB): where its time went, as one bar
// split into its parts, with each part's seconds and the job's ETTR (productive time over the whole). Loaded after
// dom.js and before dashboard.js, whose job detail draws it.
"use strict";

const GOODPUT_PARTS = [
  ["productive", "productive", "training on the GPUs it asked for, steps not taken before"],
  ["degraded", "degraded", "training on a degraded placement (slower GPUs than asked for)"],
  ["recomputed", "recomputed", "steps taken again after a fault, back to the highest step reached"],
  ["recovery", "recovery", "starting and restarting: to the first step, and from a fault to the next placement"],
  ["notice", "notice", "from a preemption notice until the gang stopped"],
  ["queued", "queued", "waiting for GPUs"],
  ["straggler", "straggler", "lost to a slow member of the gang (not measured yet)"],
];

/** ``12s``, ``3m05s``, ``2h07m``. */
function span(seconds) {
  const whole = Math.round(seconds);
  if (whole < 60) return `${whole}s`;
  if (whole < 3600) return `${Math.floor(whole / 60)}m${String(whole % 60).padStart(2, "0")}s`;
  return `${Math.floor(whole / 3600)}h${String(Math.floor((whole % 3600) / 60)).padStart(2, "0")}m`;
}

/** The ledger as a bar of its parts and a legend; null for a job without one (never accepted). */
function goodputSection(goodput) {
  if (!goodput) return null;
  const total = goodput.total_s || 0;
  const parts = GOODPUT_PARTS.map(([key, label, what]) => ({ key, label, what, seconds: goodput[`${key}_s`] || 0 }));
  const shown = parts.filter((part) => part.seconds > 0);
  const pieces = shown.map((part) => h("span", {
    class: `gp-${part.key}`, title: `${part.label}: ${span(part.seconds)} (${pct(part.seconds / total)})`,
    style: `width:${((part.seconds / total) * 100).toFixed(2)}%`,
  }));
  const legend = shown.map((part) => h("span", { class: "gp-item", title: part.what, "data-part": part.key },
    h("i", { class: `gp-${part.key}` }), `${part.label} `, h("b", {}, span(part.seconds))));
  return h("div", { id: "goodput" },
    h("div", { class: "facts" },
      fact("ETTR", goodput.ettr == null ? null : pct(goodput.ettr)), fact("of", total ? span(total) : null)),
    total ? h("div", { class: "gp-bar" }, pieces) : empty("no time yet"),
    h("div", { class: "gp-legend" }, legend));
}
