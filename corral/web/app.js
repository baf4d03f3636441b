// The corral dashboard: polls the REST API every second and redraws what changed.
// Plain browser JavaScript, no build step and nothing fetched from elsewhere (works offline).
"use strict";

(() => {
  const API = "/api/v1";
  const POLL_MS = 1000;
  const TOKEN_KEY = "corral.token";
  const RECENT_JOBS = 200;
  const QUEUE_JOBS = 100;
  const MAX_NODE_ROWS = 64; // a larger cluster's nodes: `corral node ls`
  const LOG_CHUNK_BYTES = 1 << 20; // the server's largest log reply
  const LOG_KEEP_CHARS = 512 * 1024; // older output is dropped from the page, not the server
  // A VC's colour is the palette entry at its index among the sorted VC names, so it stays the
  // same across reloads and viewers as long as the set of VCs does.
  const VC_PALETTE = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6",
  ];
  const STATES = ["PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"];

  const state = {
    token: null,
    timer: null,
    generation: 0,
    polls: 0,
    whoami: null,
    selected: null, // job id shown in the drawer
    stream: "stdout",
    log: null, // {job, attempt, stream, offset, finished}
    detailChain: Promise.resolve(),
    rendered: new Map(), // section -> signature of the data it was last drawn from
    jobsById: new Map(),
  };

  const $ = (id) => document.getElementById(id);

  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key === "data") Object.assign(node.dataset, value);
      else if (key === "style") Object.assign(node.style, value);
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  // -- token ------------------------------------------------------------------------------

  function storage() {
    try {
      return window.localStorage;
    } catch {
      return null; // storage disabled: the token lives for this page only
    }
  }

  function saveToken(token) {
    state.token = token;
    const store = storage();
    if (store) store.setItem(TOKEN_KEY, token);
  }

  function forgetToken() {
    state.token = null;
    state.whoami = null;
    const store = storage();
    if (store) store.removeItem(TOKEN_KEY);
  }

  // `#token=...` is taken into localStorage and removed from the address bar (so it is not
  // bookmarked or shared by accident); `#job=ID` opens that job's detail.
  function readFragment() {
    const params = new URLSearchParams(location.hash.slice(1));
    const token = (params.get("token") || "").trim();
    if (token) {
      saveToken(token);
      params.delete("token");
    } else {
      const store = storage();
      state.token = (store && store.getItem(TOKEN_KEY)) || null;
    }
    if (params.get("job")) state.selected = params.get("job");
    if (token) writeFragment(params);
  }

  function writeFragment(params) {
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }

  // -- talking to the API -----------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function request(path, method = "GET") {
    const response = await fetch(API + path, {
      method,
      headers: { Authorization: `Bearer ${state.token}` },
      cache: "no-store",
    });
    if (!response.ok) {
      let message = `${response.status} ${response.statusText}`;
      try {
        const body = await response.json();
        if (body && body.detail) message = String(body.detail);
      } catch {
        // not JSON: keep the status line
      }
      throw new ApiError(response.status, message);
    }
    return response;
  }

  async function post(path) {
    return (await request(path, "POST")).json();
  }

  // The drawer's controls (docs/server.md#job-controls): what the job's state allows.
  function jobActions(job) {
    const verbs = [];
    if (job.status === "PENDING") verbs.push(job.held_by ? "release" : "hold");
    if (["RUNNING", "FAILED", "CANCELLED"].includes(job.status)) verbs.push("requeue");
    const note = el("span", { class: "action-error" });
    const buttons = verbs.map((verb) => {
      const button = el("button", { type: "button", data: { action: verb } }, verb);
      button.addEventListener("click", async () => {
        button.disabled = true;
        try {
          await post(`/jobs/${encodeURIComponent(job.id)}/${verb}`);
          note.textContent = "";
          refreshDetail();
        } catch (error) {
          note.textContent = error.message;
        } finally {
          button.disabled = false;
        }
      });
      return button;
    });
    return el("div", { id: "detail-actions" }, ...buttons, note);
  }

  async function getJson(path) {
    return (await request(path)).json();
  }

  // /readyz (no token): whether this manager is ready and, beside standbys on one database, its
  // role and lease epoch (docs/ha.md). A standby or a manager that is not ready answers 503 with
  // the same body; null when it cannot be read.
  async function readiness() {
    try {
      return await (await fetch("/readyz", { cache: "no-store" })).json();
    } catch {
      return null;
    }
  }

  // -- formatting -------------------------------------------------------------------------

  function clock(epochSeconds) {
    if (epochSeconds === null || epochSeconds === undefined) return "–";
    const date = new Date(epochSeconds * 1000);
    const today = new Date().toDateString() === date.toDateString();
    const time = date.toLocaleTimeString([], { hour12: false });
    return today ? time : `${date.toLocaleDateString()} ${time}`;
  }

  // A date and a time, always (a table of jobs spans days): "2026-11-28 14:03:07", local time,
  // in a <time> whose datetime attribute is the instant in UTC.
  function stamp(epochSeconds) {
    if (epochSeconds === null || epochSeconds === undefined) return "–";
    const date = new Date(epochSeconds * 1000);
    const two = (n) => String(n).padStart(2, "0");
    const day = `${date.getFullYear()}-${two(date.getMonth() + 1)}-${two(date.getDate())}`;
    const time = `${two(date.getHours())}:${two(date.getMinutes())}:${two(date.getSeconds())}`;
    return el("time", { datetime: date.toISOString() }, `${day} ${time}`);
  }

  // A job's reason without the queue position a pending one starts with (its status is shown
  // beside it, and the queue panel orders them), as `corral ls` prints it.
  function shortReason(reason) {
    return (reason || "").replace(/^PENDING, position \d+ of \d+ in the queue(; )?/, "");
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    const h = Math.floor(s / 3600);
    if (h < 48) return `${h} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(h / 24)} d ${h % 24} h`;
  }

  function plural(n, word) {
    return `${n} ${word}${n === 1 ? "" : "s"}`;
  }

  function vcColours(names) {
    const colours = new Map();
    [...new Set(names)].sort().forEach((name, i) => {
      // past the palette, spread further VCs around the colour wheel
      colours.set(name, i < VC_PALETTE.length ? VC_PALETTE[i] : `hsl(${(i * 47) % 360} 50% 55%)`);
    });
    return colours;
  }

  function textColourFor(background) {
    const match = /^#([0-9a-f]{6})$/i.exec(background);
    if (!match) return "#ffffff";
    const value = parseInt(match[1], 16);
    const [r, g, b] = [value >> 16, (value >> 8) & 255, value & 255];
    return 0.299 * r + 0.587 * g + 0.114 * b > 160 ? "#1f2328" : "#ffffff";
  }

  function badge(status, title) {
    return el("span", { class: `badge status-${status}`, title, data: { status } }, status);
  }

  function swatch(colour) {
    return el("span", { class: "swatch", style: { background: colour } });
  }

  // Redraw a section only when its data changed, so hover titles and scroll positions survive
  // the one-second polling.
  function changed(section, data) {
    const signature = JSON.stringify(data);
    if (state.rendered.get(section) === signature) return false;
    state.rendered.set(section, signature);
    return true;
  }

  // -- the views --------------------------------------------------------------------------

  function renderHeader(cluster, jobs, counts, truncated) {
    const nodes = cluster.nodes.map((n) => n.name);
    const where = nodes.length <= 3 ? nodes.join(", ") : `${nodes.length} nodes`;
    $("cluster-name").textContent = `${where} · ${location.host}`;
    document.title = `corral · ${location.host}`;
    $("policy").textContent = cluster.policy || "–";
    const gpus = cluster.nodes.flatMap((n) => n.gpus);
    const used = gpus.filter((g) => g.job).length;
    const usage = $("gpu-usage");
    usage.textContent = `${used} / ${gpus.length}`;
    usage.dataset.used = used;
    usage.dataset.total = gpus.length;
    // REFUSED (ElasticFlow's admission) only where some job was refused
    const shown = counts.REFUSED ? [...STATES, "REFUSED"] : STATES;
    const items = shown.map((status) =>
      el(
        "span",
        { class: `count status-${status}`, data: { count: status }, title: status.toLowerCase() },
        el("b", {}, counts[status] || 0),
        ` ${status.toLowerCase()}`,
      ),
    );
    $("state-counts").replaceChildren(...items);
    $("state-counts").title = truncated
      ? `finished jobs counted among the latest ${RECENT_JOBS}`
      : "";
    const now = new Date();
    const updated = $("updated");
    updated.textContent = now.toLocaleTimeString([], { hour12: false });
    updated.dateTime = now.toISOString();
    $("summary").hidden = false;
  }

  function renderCluster(cluster, colours) {
    const legendData = [...colours.entries()];
    if (changed("legend", legendData)) {
      const entries = legendData.map(([vc, colour]) =>
        el("li", { data: { vc, colour } }, swatch(colour), vc),
      );
      entries.push(el("li", { class: "free-key", data: { vc: "" } }, swatch(""), "free"));
      $("legend").replaceChildren(...entries);
    }
    if (!changed("nodes", [cluster.nodes, legendData])) return;
    const racks = new Set(cluster.nodes.map((node) => node.rack));
    const boxes = cluster.nodes.map((node) => {
      const used = node.gpus.filter((g) => g.job).length;
      let types = [...new Set(node.gpus.map((g) => g.type))].join(", ");
      if (racks.size > 1) types = `${node.rack} · ${types}`; // where it sits, once there is a choice
      const cells = node.gpus.map((gpu) => gpuCell(node, gpu, colours));
      return el(
        "div",
        { class: "node", data: { node: node.name } },
        el(
          "div",
          { class: "node-head" },
          el("span", { class: "node-name" }, node.name),
          el("span", { class: "muted" }, `${types} · ${used}/${node.gpus.length} used`),
          // a node held out of allocation: its state and why (drained, unhealthy, down)
          node.state && node.state !== "up"
            ? el("span", { class: "node-state", title: node.reason || "" }, node.state)
            : "",
        ),
        el("div", { class: "gpus" }, ...cells),
      );
    });
    $("nodes").replaceChildren(...boxes);
  }

  // "#3" for a GPU one job holds; "#3 #5" where packing made two jobs share it.
  function gpuCell(node, gpu, colours) {
    const name = `${node.name}/${gpu.index}`;
    if (!gpu.job) {
      return el(
        "div",
        {
          class: "gpu free",
          data: { gpu: name, vc: "", job: "" },
          title: `${name} (${gpu.type}): free`,
        },
        el("span", { class: "gpu-index" }, gpu.index),
        el("span", { class: "gpu-job" }, "free"),
      );
    }
    const colour = colours.get(gpu.vc) || "#6b7280";
    const who = gpu.user ? `, user ${gpu.user}` : "";
    // Shares of the GPU: every job on it in the title, the first one's number on the cell.
    const sharers = (gpu.jobs || []).length > 1 ? gpu.jobs : [];
    const shared = sharers.length
      ? ` · shared: ${sharers.map((j) => `${j.job ? `#${j.job}` : "a job"} (${j.share})`).join(", ")}`
      : "";
    return el(
      "div",
      {
        class: "gpu busy",
        data: { gpu: name, vc: gpu.vc || "", job: gpu.job },
        title: `${name} (${gpu.type}): job ${gpu.job} ${gpu.job_name || ""} · vc ${gpu.vc}${who}${shared}`,
        style: { background: colour, color: textColourFor(colour) },
        role: "button",
        tabindex: "0",
      },
      el("span", { class: "gpu-index" }, gpu.index),
      el("span", { class: "gpu-job" }, `#${gpu.job}${sharers.length ? ` +${sharers.length - 1}` : ""}`),
      el("span", { class: "gpu-name" }, gpu.job_name || ""),
    );
  }

  function renderVcs(vcs, colours) {
    if (!changed("vcs", [vcs, [...colours.entries()]])) return;
    const rows = vcs.map((vc) => {
      const share = vc.guaranteed_gpus ? vc.allocated_gpus / vc.guaranteed_gpus : 0;
      const lent = vc.allocated_gpus > vc.guaranteed_gpus;
      return el(
        "tr",
        { data: { vc: vc.name } },
        el("td", { class: "vc-name" }, swatch(colours.get(vc.name)), vc.name),
        el("td", { class: "num", data: { field: "guaranteed" } }, vc.guaranteed_gpus),
        el(
          "td",
          {
            class: "num",
            data: { field: "allocated" },
            title: lent ? "above its guarantee: using idle GPUs lent by other VCs" : null,
          },
          el(
            "span",
            { class: "meter" },
            el("span", {
              class: lent ? "lent" : "",
              style: { width: `${Math.min(100, share * 100)}%`, background: colours.get(vc.name) },
            }),
          ),
          vc.allocated_gpus,
        ),
        el("td", { class: "num", data: { field: "running" } }, vc.running),
        el("td", { class: "num", data: { field: "pending" } }, vc.pending),
      );
    });
    $("vcs-body").replaceChildren(...rows);
  }

  // Each node's state (up, draining, drained, down) with the reason a drain gave, as `corral
  // node ls` shows it. Shown only where the cluster is small enough to list (MAX_NODE_ROWS).
  function renderNodeStates(nodes) {
    if (!changed("node-states", nodes)) return;
    $("node-states-panel").hidden = nodes.length > MAX_NODE_ROWS;
    const rows = nodes.slice(0, MAX_NODE_ROWS).map((node) =>
      el(
        "tr",
        { data: { node: node.name, state: node.state } },
        el("td", {}, node.name),
        el(
          "td",
          { title: node.reason ? `${node.reason}${node.by ? ` (${node.by})` : ""}` : null },
          el("span", { class: `badge node-${node.state}` }, node.state),
          node.reason ? ` ${node.reason}` : "",
        ),
        el("td", { class: "num" }, `${node.gpus_used}/${node.gpus}`),
        el("td", {}, node.jobs.join(", ")),
      ),
    );
    $("node-states-body").replaceChildren(...rows);
  }

  function queuePosition(job) {
    const match = /position (\d+) of/.exec(job.reason || "");
    return match ? Number(match[1]) : Number.MAX_SAFE_INTEGER;
  }

  function renderQueue(pending, colours, total) {
    const ordered = [...pending].sort(
      (a, b) => queuePosition(a) - queuePosition(b) || Number(a.id) - Number(b.id),
    );
    const shown = total > ordered.length ? ` (first ${ordered.length})` : "";
    $("queue-count").textContent = total ? plural(total, "job") + shown : "";
    $("queue-empty").hidden = ordered.length > 0;
    if (!changed("queue", [ordered, [...colours.entries()]])) return;
    const items = ordered.map((job, i) =>
      el(
        "li",
        { data: { job: job.id, position: i + 1 }, tabindex: "0", role: "button" },
        el(
          "div",
          { class: "queue-line" },
          el("span", { class: "job-id" }, `#${job.id}`),
          el("span", { class: "job-name" }, job.name),
          el("span", { class: "vc-tag" }, swatch(colours.get(job.vc) || "#6b7280"), job.vc),
          el("span", { class: "muted" }, `${plural(job.gpus, "GPU")} · ${job.user}`),
        ),
        el("div", { class: "reason", data: { reason: "" } }, job.reason || "waiting"),
      ),
    );
    $("queue").replaceChildren(...items);
  }

  // A job's progress as it reported it (docs/progress.md): a bar where it declared its
  // total_steps, the step alone otherwise; the title says the rate and the ETA.
  function progressBar(progress) {
    if (!progress) return el("span", { class: "muted" }, "–");
    const step = Math.round(progress.step);
    const rate = progress.steps_per_s ? ` · ${progress.steps_per_s.toPrecision(3)} steps/s` : "";
    const eta = progress.eta_s != null ? ` · ETA ${duration(progress.eta_s)}` : "";
    const loss = progress.loss != null ? ` · loss ${progress.loss.toPrecision(4)}` : "";
    const title = `step ${step}${progress.total_steps ? ` of ${progress.total_steps}` : ""}${rate}${eta}${loss}`;
    if (!progress.total_steps) {
      return el("span", { class: "progress-step", title }, `step ${step}`);
    }
    const share = Math.max(0, Math.min(1, progress.step / progress.total_steps));
    const percent = `${Math.round(share * 100)}%`;
    return el(
      "div",
      { class: "progress", title, role: "progressbar", data: { share: share.toFixed(3) } },
      el("div", { class: "progress-fill", style: { width: percent } }),
      el("span", { class: "progress-label" }, percent),
    );
  }

  function renderJobs(jobs, colours, truncated) {
    $("jobs-empty").hidden = jobs.length > 0;
    $("jobs").hidden = jobs.length === 0;
    $("jobs-note").textContent = truncated
      ? `the latest ${RECENT_JOBS} and every live job`
      : plural(jobs.length, "job");
    if (!changed("jobs", [jobs, [...colours.entries()], state.selected])) return;
    const rows = jobs.map((job) =>
      el(
        "tr",
        {
          class: job.id === state.selected ? "selected" : "",
          data: { job: job.id, status: job.status },
          tabindex: "0",
        },
        el("td", { class: "num job-id" }, job.id),
        el("td", { class: "job-name" }, job.name),
        el("td", {}, job.user),
        el("td", { class: "vc-tag" }, swatch(colours.get(job.vc) || "#6b7280"), job.vc),
        el("td", {}, badge(job.status, job.reason || null)),
        el("td", { class: "num" }, job.gpus),
        el("td", { class: "progress-cell" }, progressBar(job.progress)),
        el("td", { class: "num" }, job.attempts),
        el("td", { class: "num" }, job.preemptions),
        el("td", { class: "muted", data: { field: "submitted" } }, stamp(job.submitted_at)),
        el(
          "td",
          { class: "muted reason-cell", title: job.reason || null, data: { field: "reason" } },
          shortReason(job.reason),
        ),
      ),
    );
    $("jobs-body").replaceChildren(...rows);
  }

  // -- the job drawer ---------------------------------------------------------------------

  function selectJob(id) {
    state.selected = id;
    const params = new URLSearchParams(location.hash.slice(1));
    if (id) params.set("job", id);
    else params.delete("job");
    writeFragment(params);
    for (const row of $("jobs-body").children) {
      row.classList.toggle("selected", row.dataset.job === id);
    }
    state.rendered.delete("jobs");
    if (!id) {
      $("detail").hidden = true;
      delete $("detail").dataset.job;
      state.log = null;
      return;
    }
    state.log = null;
    $("log").textContent = "";
    $("detail").hidden = false;
    $("detail").dataset.job = id;
    $("detail-title").textContent = `Job ${id}`;
    refreshDetail();
  }

  // Detail refreshes run one after another, so two never read the same log offset.
  function refreshDetail() {
    state.detailChain = state.detailChain.then(loadDetail).catch(() => {});
    return state.detailChain;
  }

  async function loadDetail() {
    const id = state.selected;
    if (!id) return;
    let detail;
    try {
      detail = await getJson(`/jobs/${encodeURIComponent(id)}`);
    } catch (error) {
      if (state.selected !== id) return;
      if (error.status === 404) {
        $("detail-title").textContent = `Job ${id}`;
        $("detail-reason").textContent = `No job ${id} visible to this token.`;
        return;
      }
      throw error;
    }
    if (state.selected !== id) return;
    renderDetail(detail);
    await followLog(detail);
  }

  // The detail lists attempts in `attempt_history` (`attempts` is the summary's count).
  function attemptsOf(job) {
    if (Array.isArray(job.attempt_history)) return job.attempt_history;
    return Array.isArray(job.attempts) ? job.attempts : [];
  }

  function renderDetail(job) {
    $("detail").dataset.status = job.status;
    $("detail-title").textContent = `Job ${job.id} · ${job.name}`;
    const status = $("detail-status");
    status.className = `badge status-${job.status}`;
    status.textContent = job.status;
    $("detail-reason").textContent = job.reason || "";
    const actions = document.getElementById("detail-actions");
    if (actions) actions.remove();
    $("detail-reason").after(jobActions(job));
    const spec = job.spec || {};
    const command = Array.isArray(spec.command) ? spec.command.join(" ") : spec.command;
    const now = Date.now() / 1000;
    const fields = [
      ["user", job.user],
      ["vc", job.vc],
      ["priority", job.priority],
      ["gpus", `${job.gpus} (${plural(job.workers, "worker")})`],
      ["placement", job.placement.length ? job.placement.join(", ") : "–"],
      ["submitted", clock(job.submitted_at)],
      ["started", clock(job.started_at)],
      ["finished", clock(job.finished_at)],
      [
        job.finished_at ? "took" : "age",
        duration((job.finished_at || now) - job.submitted_at),
      ],
      ["exit code", job.exit_code ?? "–"],
      ["failures", job.failures],
      ["progress", job.progress ? progressBar(job.progress) : "–"],
      [
        "throughput",
        (job.throughput || [])
          .map((t) => `${t.steps_per_s.toPrecision(3)} steps/s on ${t.gpus} × ${t.gpu_type}${t.nodes > 1 ? ` (${t.nodes} nodes)` : ""}`)
          .join("; ") || "–",
      ],
      ["command", command || "–"],
    ];
    $("detail-fields").replaceChildren(
      ...fields.map(([key, value]) =>
        el("div", { data: { field: key } }, el("dt", {}, key), el("dd", {}, value)),
      ),
    );
    const attempts = attemptsOf(job);
    $("detail-no-attempts").hidden = attempts.length > 0;
    $("detail-attempts").replaceChildren(
      ...attempts.map((a) =>
        el(
          "tr",
          { data: { attempt: a.number } },
          el("td", { class: "num" }, a.number),
          el("td", {}, (a.gpus || []).join(", ")),
          el("td", {}, clock(a.started_at)),
          el("td", {}, duration((a.ended_at || now) - a.started_at)),
          el("td", {}, a.state),
          el("td", {}, a.outcome || "–"),
          el("td", { class: "muted" }, a.reason || ""),
        ),
      ),
    );
    if (changed("detail-events", [job.id, job.events])) {
      $("detail-events").replaceChildren(
        ...(job.events || []).map((e) =>
          el(
            "li",
            { data: { kind: e.kind } },
            el("time", {}, clock(e.at)),
            el("span", { class: "kind" }, e.kind),
            el("span", {}, e.message),
          ),
        ),
      );
    }
  }

  async function followLog(job) {
    const latest = attemptsOf(job).reduce((a, b) => (b.number > (a ? a.number : 0) ? b : a), null);
    const attempt = latest ? latest.number : 0;
    // A cancelled or preempted attempt may still write during its grace period: keep reading
    // until its processes are gone, not only until the job's status is final.
    const ended = latest !== null && latest.state === "ended";
    const pre = $("log");
    let log = state.log;
    if (!log || log.job !== job.id || log.attempt !== attempt || log.stream !== state.stream) {
      log = { job: job.id, attempt, stream: state.stream, offset: 0, finished: false };
      state.log = log;
      pre.textContent = "";
    }
    pre.dataset.attempt = attempt;
    $("log-source").textContent = attempt ? `attempt ${attempt} · rank 0 · ${log.stream}` : "";
    if (!attempt) {
      pre.dataset.empty = "not started yet";
      return;
    }
    // read until caught up, then once a poll while the attempt runs
    while (!log.finished) {
      const path =
        `/jobs/${encodeURIComponent(job.id)}/logs?attempt=${attempt}` +
        `&stream=${log.stream}&offset=${log.offset}`;
      const response = await request(path);
      const text = await response.text();
      if (state.log !== log) return; // another job, attempt or stream was chosen meanwhile
      const next = Number(response.headers.get("X-Corral-Offset"));
      const read = Number.isFinite(next) ? next - log.offset : text.length;
      log.offset += read;
      log.finished = ended && response.headers.get("X-Corral-Finished") === "true";
      if (text) appendLog(pre, text);
      pre.dataset.offset = log.offset;
      pre.dataset.finished = log.finished;
      if (read < LOG_CHUNK_BYTES) break;
    }
    pre.dataset.empty = log.finished ? "(no output)" : "waiting for output…";
  }

  function appendLog(pre, text) {
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
    let content = pre.textContent + text;
    if (content.length > LOG_KEEP_CHARS) {
      content = `… earlier output not shown …\n${content.slice(-LOG_KEEP_CHARS)}`;
    }
    pre.textContent = content;
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  // -- polling ----------------------------------------------------------------------------

  async function poll() {
    clearTimeout(state.timer);
    state.timer = null;
    // a newer poll (e.g. from the token form) supersedes one still waiting for the server
    const generation = ++state.generation;
    if (!state.token) return showLogin("");
    try {
      if (!state.whoami) {
        state.whoami = await getJson("/whoami");
        const who = state.whoami;
        $("whoami").textContent =
          `${who.user}${who.admin ? " (admin)" : ""}${who.vc ? ` · vc ${who.vc}` : ""}`;
      }
      // The queue comes in the scheduler's order, its first QUEUE_JOBS with the total: with
      // thousands waiting, the page stays as cheap to serve as with a few.
      const [cluster, recent, queue, running, nodes, ready] = await Promise.all([
        getJson("/cluster"),
        getJson(`/jobs?limit=${RECENT_JOBS}`),
        getJson(`/queue?limit=${QUEUE_JOBS}`),
        getJson("/jobs?status=RUNNING"),
        getJson("/nodes"),
        readiness(),
      ]);
      if (generation !== state.generation) return;
      showDashboard();
      render(cluster, recent, queue, running);
      renderNodeStates(nodes);
      renderManager(ready);
      if (state.selected) await refreshDetail();
      state.polls += 1;
      document.body.dataset.polls = state.polls;
      document.body.dataset.state = "live";
      $("banner").hidden = true;
    } catch (error) {
      if (generation !== state.generation) return;
      if (error.status === 401) {
        forgetToken();
        return showLogin("The server refused this token; paste another.");
      }
      document.body.dataset.state = "error";
      const banner = $("banner");
      banner.textContent = `Cannot update: ${error.message}. Retrying every second…`;
      banner.hidden = false;
    }
    if (generation === state.generation) state.timer = setTimeout(poll, POLL_MS);
  }

  // Which manager this page talks to: its address and, where managers share a database, its
  // role and lease epoch.
  function renderManager(ready) {
    const manager = $("manager");
    let text = location.host;
    if (ready && ready.role) {
      text += ` · ${ready.role}`;
      if (ready.epoch !== undefined) text += ` (epoch ${ready.epoch})`;
    }
    if (ready && ready.status !== "ready") text += ` · not ready: ${ready.reason || ready.status}`;
    manager.textContent = text;
    manager.dataset.role = (ready && ready.role) || "";
    manager.title = ready && ready.leader ? `the leader: ${ready.leader}` : "";
  }

  function render(cluster, recent, queue, running) {
    const pending = queue.jobs;
    const byId = new Map();
    for (const job of [...recent, ...pending, ...running]) byId.set(job.id, job);
    const jobs = [...byId.values()].sort((a, b) => Number(b.id) - Number(a.id));
    state.jobsById = byId;
    const truncated = recent.length >= RECENT_JOBS;
    const counts = {};
    for (const job of jobs) counts[job.status] = (counts[job.status] || 0) + 1;
    counts.PENDING = queue.total;
    const gpuVcs = cluster.nodes.flatMap((n) => n.gpus.map((g) => g.vc)).filter(Boolean);
    const colours = vcColours([...cluster.vcs.map((v) => v.name), ...gpuVcs]);
    renderHeader(cluster, jobs, counts, truncated);
    renderCluster(cluster, colours);
    renderVcs(cluster.vcs, colours);
    renderQueue(pending, colours, queue.total);
    renderJobs(jobs, colours, truncated);
  }

  function showLogin(message) {
    clearTimeout(state.timer);
    state.timer = null;
    state.generation += 1;
    state.rendered.clear();
    document.body.dataset.state = "login";
    $("dashboard").hidden = true;
    $("detail").hidden = true;
    $("summary").hidden = true;
    $("account").hidden = true;
    $("banner").hidden = true;
    $("cluster-name").textContent = location.host;
    // nothing a previous token could read stays on the page
    for (const id of ["nodes", "legend", "vcs-body", "queue", "jobs-body", "log", "node-states-body"]) {
      $(id).replaceChildren();
    }
    $("login").hidden = false;
    const error = $("login-error");
    error.textContent = message;
    error.hidden = !message;
    $("token-input").focus();
  }

  function showDashboard() {
    $("login").hidden = true;
    $("dashboard").hidden = false;
    $("account").hidden = false;
    if (state.selected) $("detail").hidden = false;
  }

  // -- events -----------------------------------------------------------------------------

  function jobIdFrom(target) {
    const holder = target.closest("[data-job]");
    return holder && holder.dataset.job ? holder.dataset.job : null;
  }

  function onActivate(container, handler) {
    container.addEventListener("click", (event) => handler(event.target));
    container.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        handler(event.target);
      }
    });
  }

  function wire() {
    for (const id of ["jobs-body", "queue", "nodes"]) {
      onActivate($(id), (target) => {
        const job = jobIdFrom(target);
        if (job) selectJob(job);
      });
    }
    $("detail-close").addEventListener("click", () => selectJob(null));
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && state.selected) selectJob(null);
    });
    for (const button of document.querySelectorAll(".toggle [data-stream]")) {
      button.addEventListener("click", () => {
        state.stream = button.dataset.stream;
        for (const other of document.querySelectorAll(".toggle [data-stream]")) {
          other.classList.toggle("on", other === button);
        }
        refreshDetail();
      });
    }
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token-input").value.trim();
      if (!token) return;
      saveToken(token);
      $("token-input").value = "";
      poll();
    });
    $("forget-token").addEventListener("click", () => {
      forgetToken();
      selectJob(null);
      showLogin("");
    });
  }

  wire();
  readFragment();
  if (state.selected) {
    $("detail").dataset.job = state.selected;
    $("detail-title").textContent = `Job ${state.selected}`;
  }
  if (state.token) poll();
  else showLogin("");
})();
