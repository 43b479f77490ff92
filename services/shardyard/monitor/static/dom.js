// Shardyard dashboard: the DOM and formatting helpers dashboard.js draws with (loaded first; plain JavaScript, no
// build step). Every piece of text goes in through textContent, never innerHTML.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

// --- building DOM ----------------------------------------------------------------------------------------------

/** An element with attributes and children (strings become text nodes). */
function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** The same for SVG, which needs its namespace. */
function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

function build(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

function badge(text, tone) {
  return h("span", { class: `badge ${tone ?? STATE_TONE[text] ?? ""}` }, text ?? "—");
}

/** A bar for a 0..1 fraction. A load turns amber from 70 % and red from 90 %; progress is green throughout. */
function bar(fraction, kind = "load") {
  const f = Math.max(0, Math.min(1, Number(fraction) || 0));
  const tone = kind === "progress" ? "progress" : f >= 0.9 ? "full" : f >= 0.7 ? "hot" : "";
  return h("div", { class: `bar ${tone}`, title: pct(f) }, h("span", { style: `width:${(f * 100).toFixed(1)}%` }));
}

function empty(text) {
  return h("p", { class: "empty" }, text);
}

// --- formatting ------------------------------------------------------------------------------------------------

function num(value, digits = 3) {
  if (value === null || value === undefined || Number.isNaN(value)) return "—";
  const v = Number(value);
  if (Math.abs(v) >= 1000) return v.toLocaleString("en", { maximumFractionDigits: 0 });
  return String(Number(v.toPrecision(digits)));
}

function pct(fraction) {
  return fraction === null || fraction === undefined ? "—" : `${Math.round(fraction * 100)}%`;
}

function gib(bytes) {
  return `${(bytes / 1024 ** 3).toFixed(bytes >= 10 * 1024 ** 3 || bytes === 0 ? 0 : 1)} GiB`;
}

function clock(iso) {
  if (!iso) return "—";
  const at = new Date(iso);
  return Number.isNaN(at.getTime()) ? String(iso) : at.toLocaleTimeString("en-GB", { hour12: false });
}

/** "14:05": a time of day to the minute, for an estimate no finer than that; on another day than ``now``'s (in the
 * browser's zone) the day goes first: "Tue 8 Dec 14:05". */
function hhmm(iso, now = new Date()) {
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return String(iso);
  const time = at.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit" });
  if (at.toDateString() === now.toDateString()) return time;
  return `${at.toLocaleDateString("en-GB", { weekday: "short", day: "numeric", month: "short" })} ${time}`;
}

function ago(iso) {
  const seconds = (Date.now() - new Date(iso).getTime()) / 1000;
  if (!Number.isFinite(seconds)) return "";
  if (seconds < 60) return `${Math.max(0, Math.round(seconds))}s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)}m ago`;
  return `${(seconds / 3600).toFixed(1)}h ago`;
}
