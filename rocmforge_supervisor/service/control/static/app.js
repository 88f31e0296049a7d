// The status page: models, devices, events and a chat box, live from the control API.

import { ActivityView } from "./activity.js";
import { AuthError, auth, getJSON, postJSON, request, sse } from "./api.js";
import { Chat } from "./chat.js";
import { renderDevices } from "./devices.js";
import { setText } from "./dom.js";
import { Timeline } from "./events.js";
import { ModelsTable } from "./models.js";

const $ = (id) => document.getElementById(id);
const ui = {
  app: $("app"),
  login: $("login"),
  loginForm: $("login-form"),
  loginKey: $("login-key"),
  loginError: $("login-error"),
  conn: $("conn"),
  summary: $("summary"),
  notice: $("notice"),
  logout: $("logout"),
  reloadConfig: $("reload-config"),
};

let generation = 0; // bumped on every (re)start and on logout: stale loops see it and stop
let models = new ModelsTable($("models"), onAuthError);
const timeline = new Timeline($("events"));
const chat = new Chat(onAuthError);
const activity = new ActivityView($("activity"), onAuthError);

function setConn(state, text) {
  ui.conn.dataset.state = state;
  setText(ui.conn, text);
}

function notice(text) {
  ui.notice.hidden = !text;
  setText(ui.notice, text || "");
}

function onAuthError() {
  generation += 1;
  ui.app.hidden = true;
  ui.reloadConfig.hidden = true;
  models.clear();
  models = new ModelsTable($("models"), onAuthError);
  timeline.clear();
  activity.clear();
  renderDevices($("devices"), { devices: [] });
  setText(ui.summary, "");
  setConn("locked", "locked");
  ui.login.hidden = false;
  ui.logout.hidden = !auth.key;
  if (auth.key) setText(ui.loginError, "That API key was refused.");
  auth.key = null;
  ui.loginKey.focus();
}

function summarize(rows) {
  const by = {};
  for (const r of rows) by[r.state] = (by[r.state] || 0) + 1;
  const parts = [`${rows.length} model${rows.length === 1 ? "" : "s"}`];
  for (const s of ["ready", "loading", "failed"]) if (by[s]) parts.push(`${by[s]} ${s}`);
  return parts.join(" · ");
}

// The controls (load, unload, reload, config reload) are an admin key's: without keys every
// caller is one; a key that is not is shown none of them (they would only fail).
let admin = false;

async function refreshModels() {
  const data = await getJSON("/api/models");
  admin = !data.key || data.key.admin;
  ui.reloadConfig.hidden = !admin;
  models.render(data.models, admin);
  chat.setModels(data.models);
  setText(ui.summary, summarize(data.models));
}

async function loop(gen, everyMs, fn) {
  while (gen === generation) {
    try {
      await fn();
      if (gen === generation) notice("");
    } catch (err) {
      if (gen !== generation) return;
      if (err instanceof AuthError) return onAuthError();
      notice(`The service did not answer: ${err.message}`);
    }
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

let refreshQueued = false;

/** One models refresh for a burst of events (a reconnect replays up to 200 at once). */
function scheduleRefresh() {
  if (refreshQueued) return;
  refreshQueued = true;
  setTimeout(() => {
    refreshQueued = false;
    refreshModels().catch(() => {}); // the poll loop reports failures
  }, 100);
}

async function followEvents(gen) {
  let delay = 500;
  while (gen === generation) {
    const abort = new AbortController();
    const stop = setInterval(() => gen !== generation && abort.abort(), 500);
    try {
      const r = await request("/api/events?replay=1", { signal: abort.signal });
      setConn("live", "live");
      delay = 500;
      timeline.clear(); // the replay brings the history again (and a restarted service counts anew)
      for await (const ev of sse(r)) {
        if (gen !== generation) break;
        const data = JSON.parse(ev.data);
        timeline.add(data);
        if (data.model !== "*") scheduleRefresh();
      }
    } catch (err) {
      if (err instanceof AuthError) return onAuthError();
    } finally {
      clearInterval(stop);
    }
    if (gen !== generation) return;
    setConn("down", "reconnecting…");
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 10000);
  }
}

async function start() {
  const gen = ++generation;
  try {
    await refreshModels();
  } catch (err) {
    if (err instanceof AuthError) return onAuthError();
    setConn("down", "unreachable");
    notice(`The service did not answer: ${err.message}`);
    setTimeout(() => gen === generation && start(), 2000);
    return;
  }
  ui.login.hidden = true;
  ui.app.hidden = false;
  ui.reloadConfig.hidden = !admin;
  ui.logout.hidden = !auth.key;
  setText(ui.loginError, "");
  loop(gen, 1000, refreshModels);
  loop(gen, 1000, async () => models.setThroughput((await getJSON("/api/throughput")).models));
  loop(gen, 2000, async () => renderDevices($("devices"), await getJSON("/api/devices")));
  loop(gen, 2000, () => activity.refresh());
  followEvents(gen);
}

ui.loginForm.addEventListener("submit", (e) => {
  e.preventDefault();
  const key = ui.loginKey.value.trim();
  if (!key) return;
  auth.key = key;
  ui.loginKey.value = "";
  setText(ui.loginError, "");
  start();
});

ui.logout.addEventListener("click", () => {
  auth.key = null;
  onAuthError();
  setText(ui.loginError, "");
});

ui.reloadConfig.addEventListener("click", async () => {
  ui.reloadConfig.disabled = true;
  try {
    const s = await postJSON("/api/reload");
    const changed = Object.entries(s).filter(([, v]) => v.length).map(([k, v]) => `${k}: ${v.join(", ")}`);
    notice(changed.length ? `Config reloaded (${changed.join("; ")})` : "Config reloaded: nothing changed");
  } catch (err) {
    if (err instanceof AuthError) return onAuthError();
    notice(`Reload refused: ${err.message}`);
  } finally {
    ui.reloadConfig.disabled = false;
  }
});

start();
