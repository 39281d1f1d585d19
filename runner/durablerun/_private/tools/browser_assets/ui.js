// The run browser's pages (served by `kubectl durablerun ui`). Plain DOM; every value is set as text,
// never as HTML. Each page is told by the server's change feed (/api/changes, Server-Sent Events) when what it
// shows changed, and only then asks for it.
"use strict";

const POLL_MS = 2000;  // only should the feed be refused (too many tabs open) or gone for good
const FOLLOW_MS = 1000;  // a followed stream is read from the run's store this often until it is finished
const token = document.querySelector('meta[name="durablerun-token"]').content;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

// The server's change feed: `onChange` at once, and whenever what the page shows changed. The browser reconnects
// a feed that drops; one refused (or gone for good) leaves the page asking every POLL_MS instead.
function feed(url, onChange) {
  const source = new EventSource(url);
  source.onmessage = () => onChange();
  source.onerror = () => {
    if (source.readyState !== EventSource.CLOSED) return;
    onChange();
    setInterval(onChange, POLL_MS);
  };
}

// `fn` run one call at a time: a call while one is under way runs once more after it, not beside it.
function serial(fn) {
  let running = false, again = false;
  return async function run() {
    if (running) { again = true; return; }
    running = true;
    try { await fn(); } finally { running = false; }
    if (again) { again = false; run(); }
  };
}

// A clock for listings that change seldom beside a run that changes often: true on the first ask, then at most
// once every `ms`.
function atMostEvery(ms) {
  let last = -Infinity;
  return () => {
    const now = Date.now();
    if (now - last < ms) return false;
    last = now;
    return true;
  };
}

async function getJSON(url) {
  const response = await fetch(url, {headers: {Accept: "application/json"}});
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function ago(time) {
  if (!time) return "";
  const s = (Date.now() - Date.parse(time)) / 1000;
  return s < 120 ? `${Math.round(s)}s ago` : s < 7200 ? `${Math.round(s / 60)}m ago`
    : s < 172800 ? `${Math.round(s / 3600)}h ago` : `${Math.round(s / 86400)}d ago`;
}

function seconds(s) {
  return s < 1 ? `${Math.round(s * 1000)}ms` : s < 120 ? `${s.toFixed(1)}s` : s < 7200 ? `${(s / 60).toFixed(1)}m`
    : `${(s / 3600).toFixed(1)}h`;
}

function bar(left, width) {
  const node = el("div", {class: "bar"});  // placed through the CSSOM: the page's CSP refuses style attributes
  node.style.marginLeft = `${left}%`;
  node.style.width = `${width}%`;
  return node;
}

function phaseBadge(phase) {
  return el("span", {class: `phase phase-${(phase || "none").toLowerCase()}`}, phase || "-");
}

// ---- the list ----------------------------------------------------------------------------------------------

function listPage() {
  const form = document.getElementById("filters");
  const params = new URLSearchParams(location.search);
  for (const input of form.elements) if (params.has(input.name)) input.value = params.get(input.name);
  let offset = Number(params.get("offset") || 0), version = "", total = 0;

  function query(withVersion) {
    const q = new URLSearchParams();
    for (const input of form.elements) if (input.value.trim()) q.set(input.name, input.value.trim());
    if (offset) q.set("offset", offset);
    if (withVersion && version) q.set("version", version);
    return q;
  }

  const refresh = serial(async () => {
    const error = document.getElementById("error");
    try {
      const page = await getJSON(`/api/runs?${query(true)}`);
      version = page.version;
      if (!page.unchanged) show(page);
      error.hidden = !page.error;
      if (page.error) error.textContent = page.error;
    } catch (e) {
      error.hidden = false;
      error.textContent = e.message;
    }
  });

  function show(page) {
    total = page.total;
    const shown = page.runs.length;
    document.getElementById("count").textContent = total
      ? `${total} run${total === 1 ? "" : "s"}; showing ${page.offset + 1}-${page.offset + shown}` : "no runs match";
    const rows = page.runs.map(r => el("tr", {"data-run": `${r.namespace}/${r.name}`},
      el("td", {}, r.namespace),
      el("td", {}, el("a", {href: `/runs/${encodeURIComponent(r.namespace)}/${encodeURIComponent(r.name)}`}, r.name)),
      el("td", {}, phaseBadge(r.phase)), el("td", {class: "num"}, r.attempt), el("td", {class: "num"}, r.restarts),
      el("td", {class: "num"}, `$${r.usd}`), el("td", {class: "num"}, r.tokens), el("td", {}, r.waitingFor || ""),
      el("td", {title: r.created, "data-created": r.created}, ago(r.created)), el("td", {class: "message"}, r.message)));
    document.querySelector("#runs tbody").replaceChildren(...rows);
    document.getElementById("prev").disabled = offset === 0;
    document.getElementById("next").disabled = offset + shown >= total;
  }

  function changed() {
    offset = 0;
    version = "";
    history.replaceState(null, "", `?${query(false)}`);
    refresh();
  }
  form.addEventListener("change", changed);
  form.addEventListener("submit", e => { e.preventDefault(); changed(); });
  document.getElementById("prev").onclick = () => { offset = Math.max(0, offset - 100); version = ""; refresh(); };
  document.getElementById("next").onclick = () => { offset += 100; version = ""; refresh(); };
  feed("/api/changes", refresh);
  // The created column says "5m ago": kept true without asking the server.
  setInterval(() => {
    for (const cell of document.querySelectorAll("#runs td[data-created]")) cell.textContent = ago(cell.dataset.created);
  }, 15000);
}

// ---- a run -------------------------------------------------------------------------------------------------

function runPage() {
  const [, , ns, name] = location.pathname.split("/").map(decodeURIComponent);
  const base = `/api/runs/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`;
  let tlOffset = 0, eventPrefilled = false, budgetWait = null, runPhase = "", canChange = false;
  document.title = `${name} · DurableRun`;
  document.getElementById("title").textContent = `${ns} / ${name}`;
  document.getElementById("name").textContent = name;

  // On the feed's word that the run changed (its status, a lease renewal with progress), and after an action.
  const refresh = serial(async () => {
    try {
      show(await getJSON(base));
      await showTimeline();
      await showStreams();
      await showLogs();
    } catch (e) {
      result(e.message, true);
    }
  });

  function show(page) {
    const run = page.run, status = run.status || {}, spec = run.spec || {};
    document.getElementById("phase").replaceChildren(phaseBadge(status.phase));
    const waiting = status.waitingFor, waitingLine = document.getElementById("waiting");
    waitingLine.hidden = !waiting || status.phase !== "Waiting";
    document.getElementById("message").textContent = waitingLine.hidden ? status.message || "" : "";
    if (waiting) {
      waitingLine.textContent = waiting.event ? `Waiting for event "${waiting.event}" since ${waiting.since || "?"}` +
        (waiting.deadline ? ` (deadline ${waiting.deadline})` : "")
        : waiting.budget ? `Waiting for a person to raise policy.askAt.${waiting.budget} since ${waiting.since || "?"}` +
          ` (spent $${(status.cost || {}).usd || "0"}, ${(status.cost || {}).tokens || 0} tokens)`
        : waiting.wakeTime ? `Sleeping until ${waiting.wakeTime}` : waiting.holder ? `Waiting for ${waiting.holder}` : "";
      if (waiting.event && !eventPrefilled) {
        document.querySelector("#event-form [name=event]").value = waiting.event;
        eventPrefilled = true;
      }
    }
    const cost = status.cost || {};
    const facts = [["workflow", spec.workflow], ["attempt", status.attempt || 0], ["restarts", status.restarts || 0],
      ["disruptions", status.disruptions || 0], ["cost", `$${cost.usd || "0"}, ${cost.tokens || 0} tokens`],
      ["pod", status.pod || "-"], ["started", status.startTime || "-"], ["finished", status.completionTime || "-"],
      ["suspend", spec.suspend ? "yes" : "no"], ...(page.queue ? [["queue", page.queue]] : []),
      ...(page.traceURL ? [["trace", el("a", {href: page.traceURL, id: "trace", target: "_blank",
        rel: "noopener noreferrer"}, status.traceID)]] : [])];
    document.getElementById("facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    document.getElementById("actions").hidden = !page.canChange;
    runPhase = status.phase || "";
    canChange = page.canChange;
    // Only what the operator would act on: a finished run takes no event, suspend or abort, and only a
    // failed or aborted one a retry (a run that succeeded would only replay to the same result).
    const finished = ["Succeeded", "Failed", "Aborted"].includes(status.phase);
    const offered = {suspend: !finished && !spec.suspend, resume: !!spec.suspend && !finished, abort: !finished,
      retry: status.phase === "Failed" || status.phase === "Aborted"};
    for (const button of document.querySelectorAll("[data-action]")) button.hidden = !offered[button.dataset.action];
    document.getElementById("event-form").hidden = finished;
    // A run waiting on its soft budget: one click raises (or lifts) the limit it reached, and it goes on.
    budgetWait = status.phase === "Waiting" && waiting && waiting.budget || null;
    document.getElementById("budget-form").hidden = !budgetWait;
    if (budgetWait) document.getElementById("budget-label").textContent =
      budgetWait === "costUSD" ? "ask again at (USD)" : "ask again at (tokens)";
    document.querySelector("#conditions tbody").replaceChildren(...(status.conditions || []).map(c =>
      el("tr", {}, el("td", {}, c.type), el("td", {}, c.status), el("td", {}, c.reason || ""),
        el("td", {class: "message"}, c.message || ""))));
    document.querySelector("#events tbody").replaceChildren(...page.events.map(e =>
      el("tr", {class: e.type === "Warning" ? "warning" : ""}, el("td", {title: e.time || ""}, ago(e.time)),
        el("td", {}, e.type), el("td", {}, e.reason), el("td", {class: "message"},
          e.count > 1 ? `${e.message} (x${e.count})` : e.message))));
    document.getElementById("children").replaceChildren(...tree(page.children, ns));
    if (!page.children.length) document.getElementById("children").append(el("li", {class: "muted"}, "none"));
    document.getElementById("input").textContent = JSON.stringify(spec.input ?? {}, null, 2);
    const res = status.result;
    document.getElementById("output").textContent = !res ? "-" : res.inline !== undefined && res.inline !== null
      ? JSON.stringify(JSON.parse(res.inline), null, 2) : `${res.size} bytes at ${res.ref}`;
  }

  function tree(children, namespace) {
    return children.map(c => el("li", {}, el("a", {href: `/runs/${encodeURIComponent(namespace)}/${encodeURIComponent(c.name)}`}, c.name),
      " ", phaseBadge(c.phase), ` $${c.usd}`, c.children.length ? el("ul", {}, ...tree(c.children, namespace)) : ""));
  }

  async function showTimeline() {
    const error = document.getElementById("timeline-error");
    let t;
    try {
      t = await getJSON(`${base}/timeline?offset=${tlOffset}`);
      error.hidden = true;
    } catch (e) {
      error.hidden = false;
      error.textContent = `The journal could not be read: ${e.message}`;
      return;
    }
    const start = Date.parse(t.start), span = Math.max(Date.parse(t.end) - start, 1);
    document.getElementById("timeline-summary").textContent =
      `${t.total} journal records, ${t.attemptCount} attempt(s), $${t.cost.usd}, ${t.cost.tokens} tokens`;
    document.querySelector("#timeline tbody").replaceChildren(...t.entries.map(e => {
      const left = (Date.parse(e.start) - start) / span * 100, width = Math.max(0.5, e.duration * 1000 / span * 100);
      const what = e.kind === "step" ? e.name : `${e.kind}: ${e.name}`;
      return el("tr", {class: `entry kind-${e.kind}${e.ok ? "" : " failed"}`, "data-kind": e.kind},
        el("td", {class: "num"}, `+${seconds((Date.parse(e.start) - start) / 1000)}`),
        el("td", {class: "num"}, seconds(e.duration)),
        el("td", {class: "barcell"}, bar(left, Math.min(width, 100 - left))),
        el("td", {class: "num"}, e.attempt), el("td", {}, e.retries ? `${what} (${e.retries} retries)` : what),
        el("td", {class: "num"}, e.usd !== "0" ? `$${e.usd}` : ""), el("td", {class: "num"}, e.tokens || ""),
        el("td", {class: "message"}, [e.reason, ...e.marks.map(m => `<- ${m}`)].filter(Boolean).join("  ")),
        el("td", {}, ...(e.kind === "step" ? fromStep(e.name) : [])));
    }));
    const last = Math.min(t.offset + t.pageSize, t.total);
    document.getElementById("tl-page").textContent = t.total ? `records ${t.offset + 1}-${last} of ${t.total}` : "nothing journaled yet";
    document.getElementById("tl-prev").disabled = t.offset === 0;
    document.getElementById("tl-next").disabled = last >= t.total;
    document.getElementById("tl-prev").onclick = () => { tlOffset = Math.max(0, tlOffset - t.pageSize); showTimeline(); };
    document.getElementById("tl-next").onclick = () => { tlOffset += t.pageSize; showTimeline(); };
  }

  // Rerun (a finished run) or fork (one no attempt holds) from a step: the plugin's `rerun` and `fork`.
  function fromStep(step) {
    if (!canChange) return [];
    const finished = ["Succeeded", "Failed", "Aborted"].includes(runPhase);
    const buttons = [];
    if (finished) {
      const rerun = el("button", {type: "button", class: "small", "data-from-step": step, "data-how": "rerun"}, "rerun");
      rerun.onclick = () => act("rerun", {step}, `Rerun ${name} from step "${step}"? Its journal from that step on ` +
        "is archived and dropped, and a new attempt runs that step and what follows again.");
      buttons.push(rerun);
    }
    if (finished || !["Pending", "Running", ""].includes(runPhase)) {
      const fork = el("button", {type: "button", class: "small", "data-from-step": step, "data-how": "fork"}, "fork");
      fork.onclick = () => {
        const to = prompt(`Fork ${name} before step "${step}": the new DurableRun's name?`, `${name}-fork`);
        if (to) post("fork", {step, to});
      };
      buttons.push(fork);
    }
    return buttons;
  }

  // The output streams: the names now and then, and the chosen one followed from where the page got to. A
  // pending chunk may yet be superseded, so each poll asks again from the first pending one.
  const KEEP_CHUNKS = 2000;  // the page keeps the newest ones: a long stream is read whole with `durablerun stream`
  // A stream's chunks come without a change to the run: a chosen one is also read every FOLLOW_MS until finished.
  let streamName = null, streamFrom = 0, streamDone = false, streamDropped = 0;
  const streamsDue = atMostEvery(5 * FOLLOW_MS);

  const showStreams = serial(async () => {
    const error = document.getElementById("stream-error");
    try {
      if (streamsDue() || streamName === null) {
        const found = await getJSON(`${base}/streams`);
        if (streamName === null && found.streams.length) choose(found.streams[0]);
        names(found.streams);
      }
      for (let rounds = 0; streamName !== null && !streamDone && rounds < 5; rounds++) {
        const page = await getJSON(`${base}/streams/${encodeURIComponent(streamName)}?from=${streamFrom}`);
        if (page.stream !== streamName) return;  // another stream was chosen meanwhile
        follow(page);
        if (!page.more) break;
      }
      error.hidden = true;
    } catch (e) {
      error.hidden = false;
      error.textContent = `The streams could not be read: ${e.message}`;
    }
  });

  function names(all) {
    document.getElementById("stream-names").replaceChildren(...all.map(n => {
      const button = el("button", {type: "button", "data-stream": n, class: n === streamName ? "selected" : ""}, n);
      button.onclick = () => { choose(n); names(all); showStreams(); };
      return button;
    }));
    if (!all.length) document.getElementById("stream-summary").textContent = "none written";
  }

  function choose(name) {
    streamName = name;
    streamFrom = 0;
    streamDone = false;
    streamDropped = 0;
    document.getElementById("stream").replaceChildren();
  }

  function follow(page) {
    const list = document.getElementById("stream");
    const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 80;  // else the reader scrolled up
    for (const item of [...list.children]) if (Number(item.dataset.offset) >= page.from) item.remove();
    for (const c of page.chunks) {
      list.append(el("li", {class: `chunk standing-${c.standing}`, "data-offset": c.offset, "data-standing": c.standing,
        title: `offset ${c.offset}: step ${c.step} (position ${c.pos}), try ${c.tries} of attempt ${c.attempt}, ${c.standing}`},
        c.text));
    }
    while (list.children.length > KEEP_CHUNKS) { list.firstElementChild.remove(); streamDropped++; }
    const pending = page.chunks.find(c => c.standing === "pending");
    streamFrom = pending ? pending.offset : page.next;
    streamDone = page.finished && !page.more && !pending;
    const count = list.children.length + streamDropped;
    document.getElementById("stream-summary").textContent = `${streamName}: ${count} chunk${count === 1 ? "" : "s"}` +
      (streamDropped ? ` (the first ${streamDropped} no longer shown)` : "") +
      (streamDone ? ", finished" : ", following");
    if (atBottom) list.scrollTop = list.scrollHeight;
  }

  // The attempts' logs from the run's store: which attempts have them, now and then; the chosen one's on a click.
  let logAttempt = null;
  const logsDue = atMostEvery(5 * FOLLOW_MS);  // attempts end seldom; a run's changes come often

  async function showLogs() {
    if (!logsDue()) return;
    const error = document.getElementById("logs-error");
    try {
      const found = await getJSON(`${base}/logs`);
      document.getElementById("log-attempts").replaceChildren(...found.attempts.map(n => {
        const button = el("button", {type: "button", "data-attempt": n, class: n === logAttempt ? "selected" : ""},
          `attempt ${n}`);
        button.onclick = () => openLogs(n);
        return button;
      }));
      if (logAttempt === null)  // else the summary says which attempt's logs are shown
        document.getElementById("logs-summary").textContent = found.attempts.length
          ? `kept for ${found.attempts.length} attempt(s)` : "none stored yet";
      error.hidden = true;
    } catch (e) {
      error.hidden = false;
      error.textContent = `The logs could not be read: ${e.message}`;
    }
  }

  async function openLogs(attempt) {
    const error = document.getElementById("logs-error");
    try {
      const page = await getJSON(`${base}/logs?attempt=${attempt}`);
      logAttempt = attempt;
      for (const b of document.querySelectorAll("#log-attempts button"))
        b.className = Number(b.dataset.attempt) === attempt ? "selected" : "";
      document.getElementById("logs").textContent = page.text;
      document.getElementById("logs-summary").textContent = `attempt ${attempt}: ${page.bytes} bytes` +
        (page.truncated ? " (the end shown)" : "");
      error.hidden = true;
    } catch (e) {
      error.hidden = false;
      error.textContent = `The logs could not be read: ${e.message}`;
    }
  }

  function result(text, failed) {
    const line = document.getElementById("result");
    line.hidden = false;
    line.className = failed ? "result error" : "result";
    line.textContent = text;
  }

  async function act(action, form, question) {
    if (confirm(question)) await post(action, form);
  }

  async function post(action, form) {
    const response = await fetch(`${base}/${action}`, {method: "POST", body: JSON.stringify(form),
      headers: {"Content-Type": "application/json", "X-Durablerun-Token": token}});
    const body = await response.json();
    result(response.ok ? body.message : body.error, !response.ok);
    refresh();
  }

  const questions = {
    suspend: `Suspend ${name}? The attempt stops at its next step boundary.`,
    resume: `Resume ${name}?`,
    abort: `Abort ${name}? A running attempt gets spec.policy.abortGracePeriod to stop and let its Sagas undo their work; then the run is Aborted.`,
    retry: `Retry ${name} from its journal? Finished steps are not executed again.`,
  };
  for (const button of document.querySelectorAll("[data-action]")) {
    button.onclick = () => act(button.dataset.action, {}, questions[button.dataset.action]);
  }
  document.getElementById("budget-form").addEventListener("submit", e => {
    e.preventDefault();
    const value = e.target.value.value;
    act("budget", {budget: budgetWait, value}, `Let ${name} go on until policy.askAt.${budgetWait} ${value}?`);
  });
  document.getElementById("lift-budget").onclick = () => act("budget", {budget: budgetWait, value: "none"},
    `Let ${name} go on without asking again (its ceilings still hold)?`);
  document.getElementById("event-form").addEventListener("submit", e => {
    e.preventDefault();
    const form = e.target;
    act("event", {event: form.event.value, payload: form.payload.value},
      `Send event "${form.event.value}" to ${name} with ${form.payload.value}? Events are write-once.`);
  });
  feed(`/api/changes?run=${encodeURIComponent(`${ns}/${name}`)}`, refresh);
  setInterval(() => {
    if (streamName !== null && !streamDone) showStreams();
    showLogs();  // an attempt's logs are stored as it ends, maybe after the run's change said so
  }, FOLLOW_MS);
}

if (document.body.dataset.page === "list") listPage(); else runPage();
