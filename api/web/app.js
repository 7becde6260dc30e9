"use strict";
// The page is a replica of the server's state. It never decides that work
// is running: "thinking" shows only while the server says the turn is
// processing AND the live connection is up. Messages get their id here, so a
// resend after a lost connection is the same message, never a second turn.
const $ = (id) => document.getElementById(id);
const UNSENT_KEY = "baton.unsent";
let token = null, current = null, conv = null, messages = [], live = false, es = null;
let streaming = null; // {run_id, seq, text, reasoning}
const openReasoning = new Set(); // the reasoning blocks the user opened, by message
let approvals = []; // the calls the current turn waits on the user for

let linkedToken = null; // a link's token waiting for the user's choice

// takeToken reads a token from a #token= link. It never silently replaces
// the token the page already holds: a link from someone else would
// otherwise sign the page in as them, and the user's messages would go to
// their account. The user chooses.
function takeToken() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    // Out of the address bar and the history at once.
    history.replaceState(null, "", location.pathname + location.search);
    let linked = "";
    try { linked = decodeURIComponent(m[1]).trim(); } catch (e) { linked = ""; }
    const stored = localStorage.getItem("baton.token");
    if (linked && !stored) localStorage.setItem("baton.token", linked);
    else if (linked && linked !== stored) { linkedToken = linked; $("tokenchoice").classList.remove("hidden"); }
  }
  token = localStorage.getItem("baton.token");
}

function closeTokenChoice() { linkedToken = null; $("tokenchoice").classList.add("hidden"); }

async function api(method, path, body) {
  const res = await fetch(path, { method, headers: { "Authorization": "Bearer " + token, "Content-Type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
  let data = null;
  const text = await res.text();
  if (text) { try { data = JSON.parse(text); } catch (e) { data = null; } }
  if (res.status === 401) { showLogin("The token was refused: " + (data && data.error ? data.error.message : "")); throw new Error("unauthorized"); }
  return { status: res.status, data };
}

function unsent() { try { return JSON.parse(localStorage.getItem(UNSENT_KEY) || "[]"); } catch (e) { return []; } }
function saveUnsent(list) { localStorage.setItem(UNSENT_KEY, JSON.stringify(list)); }
const convPath = (cid) => "/v1/conversations/" + encodeURIComponent(cid);

function showLogin(msg) {
  $("app").classList.add("hidden"); $("logout").classList.add("hidden"); $("login").classList.remove("hidden");
  if (msg) $("login").querySelector("p").textContent = msg;
}

async function loadConversations() {
  let r;
  try { r = await api("GET", "/v1/conversations"); } catch (e) { return; }
  if (r.status !== 200) return;
  const ul = $("convs"); ul.innerHTML = "";
  for (const c of r.data.conversations) {
    const li = document.createElement("li");
    li.dataset.id = c.id;
    if (c.id === current) li.classList.add("active");
    const t = document.createElement("span"); t.textContent = c.title || c.id;
    const b = document.createElement("span"); b.className = "badge"; b.textContent = c.turn_state === "idle" ? "" : c.turn_state;
    li.append(t, b);
    li.onclick = () => select(c.id);
    ul.append(li);
  }
  if (current && !r.data.conversations.some((c) => c.id === current)) gone();
}

function gone() {
  current = null; conv = null; messages = []; streaming = null;
  if (es) { es.close(); es = null; }
  setLive(false, "idle");
  $("convtitle").textContent = "No conversation selected";
  $("delete").classList.add("hidden");
  $("input").disabled = true; $("send").disabled = true;
  $("messages").innerHTML = '<p class="empty">The conversation was deleted.</p>';
  $("state").textContent = "";
}

async function select(cid) {
  current = cid; streaming = null; conv = null; messages = [];
  $("input").disabled = false; $("send").disabled = false; $("delete").classList.remove("hidden");
  document.querySelectorAll("#convs li").forEach((li) => li.classList.toggle("active", li.dataset.id === cid));
  render();
  connect();
  await refresh();
  flushUnsent();
}

// refresh reads the conversation's state again. Refreshes never overlap:
// one asked for while another runs makes one more run after it, so that an
// older read (the turn processing, before the reply) never lands after a
// newer one (the reply, the turn done) and shows "thinking" for good.
let refreshing = null, refreshAgain = false;
function refresh() {
  if (refreshing) { refreshAgain = true; return refreshing; }
  refreshing = (async () => {
    try {
      do { refreshAgain = false; await readState(); } while (refreshAgain);
    } finally { refreshing = null; }
  })();
  return refreshing;
}

async function readState() {
  if (!current) return;
  const cid = current;
  let c, all = [];
  try {
    c = await api("GET", convPath(cid));
    // The messages come a page at a time, oldest first.
    // next_after is an opaque cursor of the conversation's.
    for (let after = ""; ;) {
      const m = await api("GET", convPath(cid) + "/messages?limit=1000" + (after ? "&after=" + encodeURIComponent(after) : ""));
      if (m.status !== 200) { if (m.status === 404) c = m; break; }
      all = all.concat(m.data.messages);
      if (m.data.next_after === undefined) break;
      after = m.data.next_after;
    }
  } catch (e) { return; }
  if (cid !== current) return;
  if (c.status === 404) { gone(); loadConversations(); return; }
  if (c.status !== 200) return;
  // A turn that waits for its user's approval shows the call it stopped at.
  let waiting = [];
  if (c.data.turn_state === "waiting_for_approval") {
    try {
      const a = await api("GET", convPath(cid) + "/approvals");
      if (a.status === 200) waiting = a.data.approvals.filter((x) => x.status === "pending");
    } catch (e) {}
    if (cid !== current) return;
  }
  conv = c.data; messages = all; approvals = waiting;
  $("convtitle").textContent = conv.title || conv.id;
  render();
}

function render() {
  const box = $("messages");
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  box.innerHTML = "";
  const known = new Set(messages.map((m) => m.id));
  for (const m of messages) box.append(bubble(m.role, m.content, metaOf(m), m.id, m.reasoning));
  for (const u of unsent().filter((u) => u.cid === current && !known.has(u.id))) {
    const el = bubble("user", u.content, u.rejected ? "not sent: " + u.rejected : "not sent yet", u.id);
    el.classList.add(u.rejected ? "rejected" : "unsent");
    box.append(el);
  }
  if (streaming && (streaming.text || streaming.reasoning) && live) {
    const el = bubble("assistant", streaming.text, "streaming", "", streaming.reasoning, "run:" + streaming.run_id);
    el.classList.add("streaming"); box.append(el);
  }
  if (!messages.length && !box.children.length) box.innerHTML = '<p class="empty">No messages yet.</p>';
  if (atBottom) box.scrollTop = box.scrollHeight;
  renderState();
}

// metaOf is the note under a message: a user message's status, or how a
// reply ended when that is worth saying.
function metaOf(m) {
  if (m.role === "user") return m.status;
  if (m.superseded) return "replaced by a regenerated reply";
  if (m.stopped) return "stopped";
  if (m.truncated) return "cut off: the model stopped before the end";
  return "";
}

// bubble is a message: its reasoning, when the model showed some, in a
// block of its own that opens on demand (and stays open across renders),
// then its text.
function bubble(role, text, meta, id, reasoning, key) {
  const d = document.createElement("div");
  d.className = "msg"; d.dataset.role = role; if (id) d.dataset.id = id;
  if (reasoning) {
    key = key || id;
    const r = document.createElement("details"); r.className = "reasoning"; r.open = openReasoning.has(key);
    const s = document.createElement("summary"); s.textContent = "Reasoning";
    const body = document.createElement("div"); body.textContent = reasoning;
    r.append(s, body);
    r.ontoggle = () => { if (r.open) openReasoning.add(key); else openReasoning.delete(key); };
    d.append(r);
  }
  d.append(document.createTextNode(text));
  if (meta) { const s = document.createElement("span"); s.className = "meta"; s.textContent = meta; d.append(s); }
  return d;
}

function renderState() {
  const st = $("state"); st.innerHTML = "";
  if (!current || !conv) return;
  if (!live) {
    // Without the live connection the page cannot know whether the server
    // is working; it says so instead of guessing.
    st.innerHTML = '<span id="unknown">Not connected to the server: turn status unknown until the connection returns.</span>';
    return;
  }
  if (conv.turn_state === "processing") st.innerHTML = '<span id="thinking">thinking</span>';
  else if (conv.turn_state === "pending") st.textContent = "queued";
  else if (conv.turn_state === "waiting") st.innerHTML = '<span id="waiting">waiting for the model</span>';
  else if (conv.turn_state === "waiting_for_approval") {
    for (const a of approvals) st.append(approvalBox(a));
    if (!approvals.length) st.textContent = "waiting for an approval";
  }
  if (["processing", "pending", "waiting", "waiting_for_approval"].includes(conv.turn_state)) {
    // Stop is durable: the server commits it, then tells the worker; the
    // reply so far stays, marked stopped. A call that waits for approval
    // is denied and never sent.
    const b = document.createElement("button"); b.id = "stop"; b.type = "button"; b.textContent = "Stop";
    b.onclick = async () => { b.disabled = true; try { await api("POST", convPath(current) + "/stop"); } catch (e) {} refresh(); };
    st.append(" ", b);
  } else if (conv.turn_state === "failed") {
    st.innerHTML = '<span id="failed">The last turn failed. </span>';
    const b = document.createElement("button"); b.id = "retry"; b.type = "button"; b.textContent = "Retry";
    b.onclick = async () => { b.disabled = true; try { await api("POST", convPath(current) + "/retry"); } catch (e) {} refresh(); };
    st.append(b);
  }
}

// approvalBox shows a call that waits for the user: the tool, the exact
// arguments that will be sent, Approve and Deny. The decision names the
// arguments' hash, so the server refuses it if they changed meanwhile.
function approvalBox(a) {
  const d = document.createElement("div"); d.className = "approval"; d.dataset.id = a.id;
  const p = document.createElement("p"); p.textContent = "The assistant wants to call " + a.tool + " with:";
  const args = document.createElement("pre"); args.textContent = JSON.stringify(a.arguments, null, 2);
  const decide = (approved) => async () => {
    d.querySelectorAll("button").forEach((b) => { b.disabled = true; });
    try { await api("POST", convPath(current) + "/approvals/" + encodeURIComponent(a.id), { approved, arguments_sha256: a.arguments_sha256 }); } catch (e) {}
    refresh();
  };
  const yes = document.createElement("button"); yes.type = "button"; yes.className = "primary approve"; yes.textContent = "Approve"; yes.onclick = decide(true);
  const no = document.createElement("button"); no.type = "button"; no.className = "deny"; no.textContent = "Deny"; no.onclick = decide(false);
  d.append(p, args, yes, no);
  return d;
}

function setLive(on, why) {
  live = on;
  const c = $("conn");
  c.className = on ? "live" : (why === "idle" ? "" : "down");
  c.textContent = on ? "live" : why === "idle" ? "idle"
    : why && why.startsWith("token") ? why + ": use another token" : "disconnected, reconnecting";
  renderState();
}

function connect() {
  if (es) es.close();
  const cid = current;
  setLive(false, "connecting");
  es = new EventSource(convPath(cid) + "/events?access_token=" + encodeURIComponent(token));
  es.onopen = () => { if (cid === current) { setLive(true); refresh(); flushUnsent(); } };
  es.onerror = () => { if (cid === current) setLive(false, "down"); };
  const onState = (ev) => {
    if (cid !== current) return;
    let d = {}; try { d = JSON.parse(ev.data); } catch (e) {}
    if (d.type === "deleted") { gone(); loadConversations(); return; }
    if (["replied", "failed", "cancelled", "stopped"].includes(d.type)) streaming = null;
    refresh(); loadConversations();
  };
  es.onmessage = onState;
  es.addEventListener("ready", onState);
  es.addEventListener("reset", onState);
  // The server ends a stream for good with the reason.
  es.addEventListener("end", (ev) => {
    if (cid !== current) return;
    let d = {}; try { d = JSON.parse(ev.data); } catch (e) {}
    if (d.reason === "server_closing") return; // the browser reconnects
    es.close();
    if (d.reason === "conversation_deleted") { gone(); loadConversations(); return; }
    setLive(false, d.reason === "token_expired" ? "token expired" : "token revoked");
  });
  es.addEventListener("delta", (ev) => {
    if (cid !== current) return;
    let d; try { d = JSON.parse(ev.data); } catch (e) { return; }
    if (!streaming || streaming.run_id !== d.run_id) streaming = { run_id: d.run_id, seq: 0, text: "", reasoning: "" };
    if (d.seq <= streaming.seq) return; // a duplicate or late event
    streaming.seq = d.seq;
    // A reset carries the text and the reasoning that still stand (an
    // attempt started over). Types the page does not know (tool calls,
    // later ones) change nothing it shows.
    if (d.type === "reset") { streaming.text = d.text || ""; streaming.reasoning = d.reasoning || ""; }
    else if (d.type === "delta") streaming.text += d.text || "";
    else if (d.type === "reasoning") streaming.reasoning += d.text || "";
    else return;
    render();
  });
}

let flushing = false;
async function flushUnsent() {
  if (flushing) return;
  flushing = true;
  try {
    for (const u of unsent()) {
      if (u.rejected) continue;
      let r;
      try { r = await api("POST", convPath(u.cid) + "/messages", { id: u.id, content: u.content }); }
      catch (e) { break; } // offline: keep it, try again later
      const list = unsent();
      const i = list.findIndex((x) => x.id === u.id);
      if (r.status === 200 || r.status === 202) { if (i >= 0) list.splice(i, 1); }
      else if (r.status >= 400 && r.status < 500) { if (i >= 0) list[i].rejected = (r.data && r.data.error ? r.data.error.message : "HTTP " + r.status); }
      else break;
      saveUnsent(list);
    }
  } finally { flushing = false; }
  if (current) refresh();
}

function send(text) {
  const id = (crypto.randomUUID ? crypto.randomUUID() : Date.now() + "-" + Math.random().toString(16).slice(2));
  const list = unsent(); list.push({ cid: current, id, content: text, at: Date.now() }); saveUnsent(list);
  render();
  flushUnsent();
}

function init() {
  takeToken();
  if (!token) { showLogin(); return; }
  $("login").classList.add("hidden"); $("app").classList.remove("hidden"); $("logout").classList.remove("hidden");
  loadConversations().then(() => { const first = document.querySelector("#convs li"); if (first && !current) select(first.dataset.id); });
}

$("keeptoken").onclick = closeTokenChoice;
$("usenewtoken").onclick = () => {
  const linked = linkedToken;
  closeTokenChoice();
  if (!linked) return;
  localStorage.setItem("baton.token", linked);
  location.reload(); // start over as the other user: no state of the first one stays
};
window.addEventListener("hashchange", () => {
  if (!/token=/.test(location.hash)) return;
  const had = token;
  takeToken();
  if (!had && token) init();
});
$("loginform").onsubmit = (e) => { e.preventDefault(); localStorage.setItem("baton.token", $("token").value.trim()); init(); };
$("logout").onclick = () => { localStorage.removeItem("baton.token"); token = null; showLogin(); };
$("newconv").onsubmit = async (e) => {
  e.preventDefault();
  const r = await api("POST", "/v1/conversations", { title: $("newtitle").value.trim() });
  if (r.status === 201 || r.status === 200) { $("newtitle").value = ""; await loadConversations(); select(r.data.id); }
};
$("delete").onclick = async () => {
  if (!current || !confirm("Delete this conversation and all its messages?")) return;
  const r = await api("DELETE", convPath(current));
  if (r.status === 204 || r.status === 404) { gone(); loadConversations(); }
};
$("composer").onsubmit = (e) => { e.preventDefault(); const t = $("input").value; if (!t.trim() || !current) return; $("input").value = ""; send(t); };
$("input").onkeydown = (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); } };
window.addEventListener("online", flushUnsent);
setInterval(() => { if (unsent().some((u) => !u.rejected)) flushUnsent(); }, 2000);
init();
