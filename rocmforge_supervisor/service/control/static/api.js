// Talks to the control API. The API key lives in sessionStorage (this tab only) and goes out as a
// Bearer header: never in a URL or a cookie. EventSource cannot send headers, so server-sent
// events are read from fetch()'s streaming body instead.

const KEY = "forge.apiKey";

export class AuthError extends Error {
  constructor() {
    super("missing or invalid API key");
  }
}

export const auth = {
  get key() {
    return sessionStorage.getItem(KEY);
  },
  set key(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
  },
};

function headers(extra) {
  const h = new Headers(extra || {});
  const key = auth.key;
  if (key) h.set("Authorization", `Bearer ${key}`);
  return h;
}

let skewMs = 0; // server clock − our clock, from the Date header (1 s resolution is plenty here)

/** Seconds since the epoch on the server's clock. */
export function serverNow() {
  return (Date.now() + skewMs) / 1000;
}

async function errorText(response) {
  try {
    const body = await response.json();
    const err = body.error || body;
    return err.message || JSON.stringify(body);
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

/** fetch() with the key; throws AuthError on 401 and Error(message) on other failures. */
export async function request(path, options = {}) {
  const response = await fetch(path, { ...options, headers: headers(options.headers), cache: "no-store" });
  const date = response.headers.get("Date");
  if (date) skewMs = Date.parse(date) + 500 - Date.now();
  if (response.status === 401) throw new AuthError();
  if (!response.ok) throw new Error(await errorText(response));
  return response;
}

export async function getJSON(path) {
  return (await request(path)).json();
}

export async function postJSON(path, body) {
  const init = { method: "POST" };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { "Content-Type": "application/json" };
  }
  return (await request(path, init)).json();
}

/** Yields decoded text chunks of a streaming response body. */
export async function* textChunks(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let ended = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        ended = true;
        return;
      }
      yield value;
    }
  } finally {
    if (!ended) reader.cancel().catch(() => {}); // the caller stopped early: close the response
    reader.releaseLock();
  }
}

/** Yields whole lines of a streaming text body. */
export async function* lines(response) {
  let buffer = "";
  for await (const chunk of textChunks(response)) {
    buffer += chunk;
    let i;
    while ((i = buffer.indexOf("\n")) >= 0) {
      yield buffer.slice(0, i).replace(/\r$/, "");
      buffer = buffer.slice(i + 1);
    }
  }
  if (buffer) yield buffer;
}

/** Yields {event, data} for each server-sent event of a streaming response. */
export async function* sse(response) {
  let event = "message";
  let data = [];
  for await (const line of lines(response)) {
    if (line === "") {
      if (data.length) yield { event, data: data.join("\n") };
      event = "message";
      data = [];
    } else if (line.startsWith("data:")) {
      data.push(line.slice(5).replace(/^ /, ""));
    } else if (line.startsWith("event:")) {
      event = line.slice(6).trim();
    } // comments (": ping") and other fields are ignored
  }
  if (data.length) yield { event, data: data.join("\n") };
}
