// Devices with memory bars: what our children hold, what others use, what is free.

import { bytes, h } from "./dom.js";

function pct(part, total) {
  return total > 0 ? `${Math.max(0, Math.min(100, (100 * part) / total)).toFixed(2)}%` : "0%";
}

function segment(cls, width, title) {
  const el = h("span", { class: `seg ${cls}`, title });
  el.style.width = width; // CSSOM, not a style attribute: allowed by the page's CSP
  return el;
}

function deviceItem(d) {
  const ours = Math.min(d.ours_bytes, d.used_bytes || d.ours_bytes);
  const others = Math.max(0, d.used_bytes - ours);
  const label = d.vendor === "cpu" ? "RAM" : "VRAM";
  const summary =
    `${label} ${bytes(d.used_bytes)} used of ${bytes(d.total_bytes)}` +
    ` · ours ${bytes(d.ours_bytes)} · free ${bytes(d.free_bytes)}`;
  const segs = Object.entries(d.models).map(([model, n], i) =>
    segment(`ours c${i % 4}`, pct(Math.min(n, ours), d.total_bytes), `${model}: ${bytes(n)}`),
  );
  segs.push(segment("others", pct(others, d.total_bytes), `others: ${bytes(others)}`));
  const models = Object.entries(d.models).map(([model, n]) => `${model} ${bytes(n)}`);
  const facts = [];
  if (d.temperature_c !== null && d.temperature_c !== undefined) facts.push(`${d.temperature_c} °C`);
  if (d.utilization_pct !== null && d.utilization_pct !== undefined) facts.push(`${d.utilization_pct}% busy`);
  if (d.gtt_total_bytes) facts.push(`GTT ${bytes(d.gtt_used_bytes || 0)} / ${bytes(d.gtt_total_bytes)}`);
  return h(
    "li",
    { class: `device card${d.usable ? "" : " skipped"}`, "data-device": d.key },
    h(
      "div",
      { class: "device-head" },
      h("strong", { text: d.key }),
      h("span", { class: "device-name", text: d.name }),
      d.integrated ? h("span", { class: "badge", text: "iGPU" }) : null,
    ),
    d.usable
      ? h("div", { class: "bar", role: "img", "aria-label": summary }, segs)
      : h("p", { class: "skip-reason" }, h("strong", {}, "skipped: "), d.skip_reason || "not usable"),
    d.usable ? h("p", { class: "device-facts", text: summary }) : null,
    models.length ? h("p", { class: "device-models", text: `held by ${models.join(", ")}` }) : null,
    facts.length ? h("p", { class: "device-facts", text: facts.join(" · ") }) : null,
  );
}

export function renderDevices(list, data) {
  const items = data.devices.map(deviceItem);
  for (const note of data.notes || []) items.push(h("li", { class: "note", text: note }));
  list.replaceChildren(...items);
}
