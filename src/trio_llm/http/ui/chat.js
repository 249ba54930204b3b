// The chat page's behaviour. It speaks only the server's public OpenAI API: GET v1/models for
// the picker, POST v1/chat/completions with stream: true for replies (server-sent events, with
// stream_options.include_usage so the last event counts the reply's tokens). The conversation
// lives in this page; Stop aborts the fetch, which closes the stream, and the server aborts the
// request in the engine when its client goes away. URLs are relative to the page, so it also
// works behind a proxy that serves the server under a path.
//
// Images: for a model whose /v1/models card lists "image" in input_modalities, a picture pasted,
// dropped or picked goes with the next message as an OpenAI `image_url` part holding a data:
// URL (the page never uploads anything elsewhere, and its CSP allows data: images only), and
// stays in the history, as the API is stateless. For a text-only model the control is disabled
// and says why.

import { renderMarkdown } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const ui = {
  model: $("model"),
  settingsToggle: $("settings-toggle"),
  settings: $("settings"),
  temperature: $("temperature"),
  maxTokens: $("max-tokens"),
  system: $("system"),
  extra: $("extra"),
  auth: $("auth"),
  apiKey: $("api-key"),
  conversation: $("conversation"),
  empty: $("empty"),
  status: $("status"),
  composer: $("composer"),
  prompt: $("prompt"),
  send: $("send"),
  stop: $("stop"),
  newChat: $("new-chat"),
  attach: $("attach"),
  file: $("file"),
  attachments: $("attachments"),
};

/** The messages sent with each request: {role, content}, user and assistant turns. */
let history = [];
/** The AbortController of the reply being streamed, or null. */
let inFlight = null;
/** The /v1/models cards by id, for what each model takes. */
let cards = new Map();
/** The images attached to the next message: data: URLs, in the order attached. */
let pending = [];

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// -- settings, kept across visits (the API key only for this tab) ---------------------------

const SAVED = ["temperature", "maxTokens", "system", "extra"];

function restoreSettings() {
  for (const name of SAVED) {
    const value = localStorage.getItem(`trio-llm.${name}`);
    if (value !== null) ui[name].value = value;
    ui[name].addEventListener("change", () => {
      localStorage.setItem(`trio-llm.${name}`, ui[name].value);
    });
  }
  const key = sessionStorage.getItem("trio-llm.apiKey");
  if (key) {
    ui.apiKey.value = key;
    ui.auth.hidden = false;
  }
}

function requestFields() {
  const fields = {};
  const temperature = parseFloat(ui.temperature.value);
  if (Number.isFinite(temperature)) fields.temperature = temperature;
  const maxTokens = parseInt(ui.maxTokens.value, 10);
  if (Number.isFinite(maxTokens) && maxTokens > 0) fields.max_tokens = maxTokens;
  const extra = ui.extra.value.trim();
  if (extra) {
    let parsed;
    try {
      parsed = JSON.parse(extra);
    } catch (error) {
      throw new Error(`Extra request fields are not JSON: ${error.message}`);
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
      throw new Error("Extra request fields must be a JSON object");
    }
    Object.assign(fields, parsed);
  }
  return fields;
}

// -- the API ----------------------------------------------------------------------------------

async function api(path, options = {}) {
  const headers = { "Content-Type": "application/json" };
  const key = ui.apiKey.value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { ...options, headers });
  if (response.ok) return response;
  let message = `${response.status} ${response.statusText}`;
  try {
    message = (await response.json()).error?.message ?? message;
  } catch {
    // not an OpenAI error body; keep the status line
  }
  if (response.status === 401) askForKey();
  throw new ApiError(response.status, message);
}

function askForKey() {
  ui.auth.hidden = false;
  ui.apiKey.focus();
}

async function loadModels() {
  try {
    const { data } = await (await api("v1/models")).json();
    const previous = ui.model.value;
    cards = new Map(data.map((card) => [card.id, card]));
    ui.model.replaceChildren(
      ...data.map((card) => new Option(card.id, card.id, false, card.id === previous)),
    );
    setStatus("");
    updateAttach();
  } catch (error) {
    setStatus(`Could not list the models: ${error.message}`);
  }
}

/** The parsed `data:` payloads of a server-sent event stream, up to `[DONE]`. */
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

// -- images ---------------------------------------------------------------------------------

/** Pictures larger than this (either edge) are scaled down before they are sent. */
const MAX_EDGE = 2048;
/** Files larger than this are re-encoded (as JPEG) even when their edges fit. */
const MAX_BYTES = 4 << 20;

function takesImages() {
  return (cards.get(ui.model.value)?.input_modalities ?? []).includes("image");
}

/** Why images cannot be attached now, or null when they can. */
function imageRefusal() {
  if (!ui.model.value) return "No model to send images to.";
  if (!takesImages()) return `${ui.model.value} takes text only; images need a vision model.`;
  return null;
}

function updateAttach() {
  const refusal = imageRefusal();
  ui.attach.disabled = refusal !== null;
  ui.attach.title = refusal ?? "Attach an image (or paste or drop one here)";
}

function readAsDataUrl(blob) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
}

/**
 * The picture as a data: URL: its own bytes when they are small enough, else scaled to fit
 * MAX_EDGE and re-encoded. Every turn resends the whole history, pictures included, and the
 * server takes at most 16 MiB a body and 20 MiB a picture; a screenshot of a large screen
 * would otherwise end the conversation after a turn or two. The models' processors scale
 * pictures down further anyway (LLaVA to 336, SmolVLM to 2048 at most).
 */
async function pictureUrl(file) {
  const bitmap = await createImageBitmap(file);
  const scale = Math.min(1, MAX_EDGE / Math.max(bitmap.width, bitmap.height));
  if (scale === 1 && file.size <= MAX_BYTES) {
    bitmap.close();
    return readAsDataUrl(file);
  }
  const canvas = document.createElement("canvas");
  canvas.width = Math.max(1, Math.round(bitmap.width * scale));
  canvas.height = Math.max(1, Math.round(bitmap.height * scale));
  const context = canvas.getContext("2d");
  context.fillStyle = "#ffffff"; // JPEG has no alpha: transparent parts become white, not black
  context.fillRect(0, 0, canvas.width, canvas.height);
  context.drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  bitmap.close();
  return canvas.toDataURL("image/jpeg", 0.92);
}

/** Attach the image files among `files` (pasted, dropped or picked); say why not otherwise. */
async function attachFiles(files) {
  const images = [...files].filter((file) => file.type.startsWith("image/"));
  if (!images.length) {
    if (files.length) setStatus(`${files[0].name || "That"} is not an image.`);
    return;
  }
  const refusal = imageRefusal();
  if (refusal) {
    setStatus(refusal);
    return;
  }
  for (const file of images) {
    try {
      pending.push(await pictureUrl(file));
    } catch {
      setStatus(`${file.name || "The image"} could not be read as a picture.`);
      continue;
    }
    setStatus("");
  }
  showPending();
}

function thumbnail(url) {
  const image = document.createElement("img");
  image.className = "thumb";
  image.src = url;
  image.alt = "attached image";
  return image;
}

function showPending() {
  ui.attachments.replaceChildren(
    ...pending.map((url, index) => {
      const item = document.createElement("span");
      item.className = "attachment";
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "remove";
      remove.textContent = "×";
      remove.setAttribute("aria-label", "Remove this image");
      remove.addEventListener("click", () => {
        pending.splice(index, 1);
        showPending();
        ui.prompt.focus();
      });
      item.append(thumbnail(url), remove);
      return item;
    }),
  );
  ui.attachments.hidden = pending.length === 0;
}

/** The files a paste or drop carries, or none when it carries no files (text stays text). */
function carriedFiles(transfer) {
  return transfer && [...transfer.types].includes("Files") ? [...transfer.files] : [];
}

// -- the conversation -------------------------------------------------------------------------

function addMessage(role, text, images = []) {
  ui.empty.hidden = true;
  const message = document.createElement("article");
  message.className = `message ${role}`;
  if (images.length) {
    const strip = document.createElement("div");
    strip.className = "images";
    strip.append(...images.map(thumbnail));
    message.append(strip);
  }
  const body = document.createElement("div");
  body.className = "body";
  if (role === "user") body.textContent = text;
  message.append(body);
  ui.conversation.append(message);
  scrollToEnd(true);
  return message;
}

function nearEnd() {
  const page = document.scrollingElement;
  return page.scrollHeight - page.scrollTop - page.clientHeight < 80;
}

function scrollToEnd(force) {
  if (force || nearEnd()) window.scrollTo(0, document.scrollingElement.scrollHeight);
}

/** Re-render a reply at most once a frame while it streams, with a cursor at its end. */
function renderer(message) {
  const body = message.querySelector(".body");
  let text = "";
  let pending = false;
  let streaming = true;
  const draw = () => {
    pending = false;
    const follow = nearEnd();
    body.replaceChildren(renderMarkdown(text));
    if (streaming) {
      let end = body; // the innermost element the text ends in
      while (end.lastChild instanceof Element && end.lastChild.tagName !== "BR") {
        end = end.lastChild;
      }
      const cursor = document.createElement("span");
      cursor.className = "cursor";
      end.append(cursor);
    }
    if (follow) scrollToEnd(true);
  };
  return {
    update(next) {
      text = next;
      if (!pending) {
        pending = true;
        requestAnimationFrame(draw);
      }
    },
    finish() {
      streaming = false;
      draw();
    },
  };
}

function showStats(message, reply) {
  const stats = document.createElement("div");
  stats.className = "stats";
  const parts = [];
  if (reply.firstAt !== null) parts.push(`TTFT ${formatMs(reply.firstAt - reply.startedAt)}`);
  // Without a usage event (a stopped reply) the count is of content events, about one a token.
  const tokens = reply.usage?.completion_tokens ?? reply.events;
  const approx = reply.usage ? "" : "≈";
  if (tokens) parts.push(`${approx}${tokens} token${tokens === 1 ? "" : "s"}`);
  if (tokens > 1 && reply.lastAt > reply.firstAt) {
    const rate = (tokens - 1) / ((reply.lastAt - reply.firstAt) / 1000);
    parts.push(`${approx}${rate.toFixed(1)} tok/s`);
  }
  if (reply.stopped) parts.push("stopped");
  else if (reply.finish === "length") parts.push("cut at max tokens");
  stats.append(parts.join(" · "));
  if (reply.error) {
    const error = document.createElement("span");
    error.className = "error";
    error.textContent = `${parts.length ? " · " : ""}${reply.error}`;
    stats.append(error);
  }
  message.append(stats);
}

function formatMs(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

async function send(text, images) {
  let fields;
  try {
    fields = requestFields();
  } catch (error) {
    setStatus(error.message);
    giveBack(text, images);
    return;
  }
  setStatus("");
  // The OpenAI form: plain text, or a list of parts when pictures go with it.
  const content = images.length
    ? [
        ...(text ? [{ type: "text", text }] : []),
        ...images.map((url) => ({ type: "image_url", image_url: { url } })),
      ]
    : text;
  const turn = { role: "user", content };
  const question = addMessage("user", text, images);
  const answer = addMessage("assistant", "");
  const view = renderer(answer);
  view.update("");
  const system = ui.system.value.trim();
  const messages = [...(system ? [{ role: "system", content: system }] : []), ...history, turn];
  const body = {
    ...fields,
    ...(ui.model.value ? { model: ui.model.value } : {}),
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  const reply = {
    startedAt: performance.now(),
    firstAt: null,
    lastAt: null,
    events: 0,
    content: "",
    usage: null,
    finish: null,
    stopped: false,
    error: null,
  };
  const controller = new AbortController();
  inFlight = controller;
  setBusy(true);
  try {
    const response = await api("v1/chat/completions", {
      method: "POST",
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    for await (const event of events(response)) {
      if (event.error) throw new Error(event.error.message);
      if (event.usage) reply.usage = event.usage;
      for (const choice of event.choices ?? []) {
        const delta = choice.delta?.content;
        if (delta) {
          const now = performance.now();
          reply.firstAt ??= now;
          reply.lastAt = now;
          reply.events += 1;
          reply.content += delta;
          view.update(reply.content);
        }
        if (choice.finish_reason) reply.finish = choice.finish_reason;
      }
    }
  } catch (error) {
    if (error.name === "AbortError") reply.stopped = true;
    else reply.error = error.message;
  } finally {
    if (inFlight === controller) inFlight = null;
    setBusy(false);
  }
  if (!reply.content && (reply.error || reply.stopped)) {
    // Nothing came back (a bad setting, a missing key): give the text back to edit and resend.
    question.remove();
    answer.remove();
    ui.empty.hidden = ui.conversation.querySelector(".message") !== null;
    giveBack(text, images);
    setStatus(reply.error ?? "Stopped before the first token.");
    return;
  }
  view.finish();
  showStats(answer, reply);
  history.push(turn, { role: "assistant", content: reply.content });
  scrollToEnd(false);
}

/** Put an unsent message back in the composer, unless something new was typed or attached. */
function giveBack(text, images) {
  if (!ui.prompt.value) ui.prompt.value = text;
  if (!pending.length) {
    pending = images;
    showPending();
  }
}

function stop() {
  inFlight?.abort();
}

function setBusy(busy) {
  ui.send.hidden = busy;
  ui.stop.hidden = !busy;
  if (!busy) ui.prompt.focus();
}

function setStatus(text) {
  ui.status.textContent = text;
}

function newChat() {
  stop();
  history = [];
  pending = [];
  showPending();
  for (const message of ui.conversation.querySelectorAll(".message")) message.remove();
  ui.empty.hidden = false;
  setStatus("");
  ui.prompt.focus();
}

// -- wiring -----------------------------------------------------------------------------------

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = ui.prompt.value.trim();
  if ((!text && !pending.length) || inFlight) return;
  const refusal = pending.length ? imageRefusal() : null;
  if (refusal) {
    setStatus(`${refusal} Remove the attached images or pick another model.`);
    return;
  }
  const images = pending;
  pending = [];
  showPending();
  ui.prompt.value = "";
  send(text, images);
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    ui.composer.requestSubmit();
  } else if (event.key === "Escape") {
    stop();
  }
});
ui.stop.addEventListener("click", stop);
ui.model.addEventListener("change", updateAttach);
ui.attach.addEventListener("click", () => ui.file.click());
ui.file.addEventListener("change", () => {
  attachFiles(ui.file.files);
  ui.file.value = ""; // picking the same file again is a change too
});
document.addEventListener("paste", (event) => {
  const files = carriedFiles(event.clipboardData);
  if (!files.length) return; // pasted text goes into the box as usual
  event.preventDefault();
  attachFiles(files);
});
// A drop anywhere on the page attaches; without preventDefault the browser would open the file.
document.addEventListener("dragover", (event) => {
  // While dragging, the files themselves are hidden; their kind is not.
  if ([...(event.dataTransfer?.types ?? [])].includes("Files")) {
    event.preventDefault();
    event.dataTransfer.dropEffect = takesImages() ? "copy" : "none";
  }
});
document.addEventListener("drop", (event) => {
  const files = carriedFiles(event.dataTransfer);
  if (!files.length) return;
  event.preventDefault();
  attachFiles(files);
});
ui.newChat.addEventListener("click", newChat);
ui.settingsToggle.addEventListener("click", () => {
  ui.settings.hidden = !ui.settings.hidden;
  ui.settingsToggle.setAttribute("aria-expanded", String(!ui.settings.hidden));
});
ui.auth.addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("trio-llm.apiKey", ui.apiKey.value.trim());
  loadModels();
  ui.prompt.focus();
});

restoreSettings();
loadModels();
