// A chat page built from the AI SDK's useChat and its default transport,
// unchanged, talking to Baton: the chat's history comes from
// GET /v1/chat/{id}, messages go to POST /v1/chat, a reload or a second tab
// resumes the running reply from GET /v1/chat/{id}/stream, and Stop asks
// the server to stop (POST /v1/conversations/{id}/stop), which the AI SDK
// never does by itself. A tool call that waits for the user's approval
// shows Approve and Deny: addToolApprovalResponse answers it, and useChat
// sends the answer in its next request, which Baton takes as the
// approval's decision. The page is served from the same origin as the API
// (serve.go proxies /v1), and signs in with a Baton token given as
// #token=... once.
import { useEffect, useRef, useState } from "react";
import { createRoot } from "react-dom/client";
import { useChat } from "@ai-sdk/react";
import { DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } from "ai";

const API = "/v1";

function token() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    sessionStorage.setItem("baton.token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("baton.token") || "";
}

// chatId is the chat of the page: ?chat=<id>, or a new one, kept in the
// address so that a reload comes back to it.
function chatId() {
  const url = new URL(location.href);
  let id = url.searchParams.get("chat");
  if (!id) {
    id = crypto.randomUUID();
    url.searchParams.set("chat", id);
    history.replaceState(null, "", url);
  }
  return id;
}

const auth = () => ({ Authorization: "Bearer " + token() });

async function loadHistory(id) {
  const res = await fetch(`${API}/chat/${encodeURIComponent(id)}`, { headers: auth() });
  if (res.status === 404) return []; // a new chat
  if (!res.ok) throw new Error(`the history did not load (HTTP ${res.status})`);
  return (await res.json()).messages;
}

function App() {
  const [id] = useState(chatId);
  const [initial, setInitial] = useState(null);
  const [loadError, setLoadError] = useState("");
  useEffect(() => {
    let stop = false;
    const load = (wait) => loadHistory(id).then((m) => !stop && setInitial(m), (e) => {
      if (stop) return;
      setLoadError(e.message);
      setTimeout(() => load(Math.min(wait * 2, 4000)), wait); // the API may be restarting
    });
    load(250);
    return () => { stop = true; };
  }, [id]);
  if (!initial) return <main><p id="loading">{loadError || "Loading…"}</p></main>;
  return <Chat id={id} initialMessages={initial} />;
}

function Chat({ id, initialMessages }) {
  const [input, setInput] = useState("");
  const retry = useRef(0);
  const { messages, sendMessage, status, error, stop, resumeStream, addToolApprovalResponse } = useChat({
    id,
    messages: initialMessages,
    resume: true, // a running reply continues after a reload, in any tab
    transport: new DefaultChatTransport({ api: `${API}/chat`, headers: auth }),
    // An answered approval goes to the server at once, which resumes the
    // turn with the call sent (approved) or not (denied).
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onError: (e) => {
      // A lost connection (a TypeError from fetch: the API restarted, say)
      // resumes the reply where the server has it, with a growing pause;
      // 204 means it is over. A failed turn's error is shown as it is.
      if (!(e instanceof TypeError)) return;
      const wait = Math.min(250 * 2 ** retry.current++, 4000);
      setTimeout(() => resumeStream(), wait);
    },
    onFinish: ({ isDisconnect }) => { if (!isDisconnect) retry.current = 0; },
  });

  const busy = status === "submitted" || status === "streaming";
  const stopTurn = async () => {
    // The server stops the turn and ends the stream with the reply so
    // far, marked stopped; stop() only stops reading, so it is the
    // fallback when the server cannot be reached.
    try {
      const res = await fetch(`${API}/conversations/${encodeURIComponent(id)}/stop`, { method: "POST", headers: auth() });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
    } catch {
      stop();
    }
  };
  const send = (e) => {
    e.preventDefault();
    if (!input.trim() || busy) return;
    sendMessage({ text: input });
    setInput("");
  };

  return (
    <main>
      <header><h1>Baton chat</h1><span id="status">{status}</span></header>
      <div id="messages">
        {messages.map((m) => <Message key={m.id} message={m} answer={addToolApprovalResponse} />)}
      </div>
      {error && <div id="error">{error.message}</div>}
      <form onSubmit={send}>
        <textarea id="input" value={input} onChange={(e) => setInput(e.target.value)} placeholder="Message" />
        {busy ? <button type="button" id="stop" onClick={stopTurn}>Stop</button> : <button id="send">Send</button>}
      </form>
    </main>
  );
}

function Message({ message, answer }) {
  const md = message.metadata || {};
  return (
    <div className="msg" data-role={message.role} data-id={message.id}>
      {message.parts.map((p, i) => {
        if (p.type === "text") return <span key={i} className="text">{p.text}</span>;
        if (p.type === "reasoning") {
          return (
            <details key={i} className="reasoning">
              <summary>Reasoning</summary>
              {p.text}
            </details>
          );
        }
        if (p.type === "dynamic-tool" || p.type.startsWith("tool-")) {
          return (
            <div key={i} className="tool" data-tool={p.toolName} data-state={p.state}>
              <span className="tool-name">{p.toolName}</span>{" "}
              <span className="tool-input">{JSON.stringify(p.input)}</span>
              {p.state === "output-available" && <> → <span className="tool-output">{String(p.output)}</span></>}
              {p.state === "output-error" && <> → <span className="tool-error">{p.errorText}</span></>}
              {p.state === "output-denied" && <> → <span className="tool-denied">not sent</span></>}
              {p.state === "approval-requested" && (
                <span className="approval">
                  {" "}
                  <button type="button" className="approve" onClick={() => answer({ id: p.approval.id, approved: true })}>Approve</button>
                  <button type="button" className="deny" onClick={() => answer({ id: p.approval.id, approved: false })}>Deny</button>
                </span>
              )}
            </div>
          );
        }
        return null;
      })}
      {md.stopped && <span className="note stopped">stopped</span>}
      {md.truncated && <span className="note">cut off</span>}
      {md.failed && <span className="note failed">failed</span>}
    </div>
  );
}

createRoot(document.getElementById("root")).render(<App />);
