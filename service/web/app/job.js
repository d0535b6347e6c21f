// The live job page: charts (uPlot) fed by the job's live stream (GET /v1/jobs/{id}/live), checkpoints,
// pause/resume/cancel, and other jobs overlaid on the same charts. Where uPlot is not installed on the
// server (`make web` not run; the page says so) each chart is a table of its latest steps instead. Every call goes to the /v1 API itself,
// authenticated by the session cookie (writes add the X-CSRF-Token header). window.stare exposes the page's
// state (the browser test reads the number of points drawn from it).
"use strict";
(function () {
  const COLORS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#7f7f7f", "#8c6d1f"];
  const BAND_FILL = "rgba(0, 114, 178, 0.12)";
  const TERMINAL = ["succeeded", "failed", "cancelled"];
  const HAS_UPLOT = typeof window.uPlot === "function";
  const TABLE_ROWS = 20; // the newest steps a chart shows as a table
  const groups = JSON.parse(document.getElementById("chart-groups").textContent);
  let job = JSON.parse(document.getElementById("job-data").textContent);
  const jobId = job.id;

  // Each run (this job, then the overlaid ones): its metric values by step, and the keys it logged.
  const runs = [{ id: jobId, label: job.name || jobId, steps: new Map(), keys: new Set(), main: true }];
  const charts = {};
  const state = {
    jobId: jobId,
    charts: charts,
    runs: runs,
    received: 0,
    streamEvents: 0,
    ended: false,
    checkpoints: [],
    notes: null, // {warnings, samples} from GET /v1/jobs/{id} (loadNotes)
    status: function () { return job.status; },
    // Points drawn for this job's first series of a chart (e.g. policy entropy on "entropy").
    points: function (chartId) {
      const chart = charts[chartId];
      if (!chart) return 0;
      return chart.plot.data[1].filter(function (v) { return v !== null && v !== undefined; }).length;
    },
    seriesCount: function (chartId) {
      const chart = charts[chartId];
      return chart ? chart.plot.series.length - 1 : 0;
    },
    seriesLabels: function (chartId) {
      const chart = charts[chartId];
      return chart ? chart.plot.series.slice(1).map(function (s) { return s.label; }) : [];
    },
  };
  window.stare = state;

  function addPoints(run, points) {
    for (const point of points) {
      const values = {};
      for (const [key, value] of Object.entries(point.values)) {
        if (typeof value === "number" && Number.isFinite(value)) {
          values[key] = value;
          run.keys.add(key);
        }
      }
      run.steps.set(point.step, values);
    }
  }

  // ---------------------------------------------------------------------------------------- charts

  function chartBox(group) {
    let box = document.getElementById("chart-" + group.id);
    if (!box) {
      box = document.createElement("div");
      box.className = "chart";
      box.id = "chart-" + group.id;
      box.dataset.chart = group.id;
      const title = document.createElement("h3");
      title.textContent = group.title;
      box.appendChild(title);
      const help = document.createElement("p");
      help.className = "help";
      help.textContent = group.series.map(function (s) { return s.label + " (" + s.unit + ")"; }).join(" · ");
      box.appendChild(help);
      document.getElementById("charts").appendChild(box);
    }
    return box;
  }

  function layout(group) {
    const series = [{ label: "step" }];
    const columns = [];
    let color = 0;
    runs.forEach(function (run, index) {
      for (const spec of group.series) {
        if (!run.keys.has(spec.key)) continue;
        const line = {
          label: run.main ? spec.label : run.label + ": " + spec.label,
          stroke: COLORS[color++ % COLORS.length],
          width: run.main ? 1.6 : 1.8,
          spanGaps: true,
          points: { show: false },
        };
        if (spec.dash || !run.main) line.dash = spec.dash ? [6, 4] : [3 + 2 * index, 3];
        if (spec.stepped && HAS_UPLOT) line.paths = uPlot.paths.stepped({ align: 1 });
        series.push(line);
        columns.push({ run: run, key: spec.key });
      }
    });
    const bands = [];
    const main = runs[0];
    if (group.band && columns.length && group.band.every(function (k) { return main.keys.has(k); })) {
      const high = series.length;
      series.push({ label: "band high", stroke: "rgba(0,114,178,0.35)", width: 0.6, spanGaps: true, points: { show: false } });
      series.push({ label: "band low", stroke: "rgba(0,114,178,0.35)", width: 0.6, spanGaps: true, points: { show: false } });
      columns.push({ run: main, key: group.band[1] }, { run: main, key: group.band[0] });
      bands.push({ series: [high, high + 1], fill: BAND_FILL });
    }
    return { series: series, columns: columns, bands: bands };
  }

  function data(columns) {
    const steps = new Set();
    for (const column of columns) for (const step of column.run.steps.keys()) steps.add(step);
    const xs = Array.from(steps).sort(function (a, b) { return a - b; });
    const out = [xs];
    for (const column of columns) {
      out.push(xs.map(function (x) {
        const values = column.run.steps.get(x);
        return values && column.key in values ? values[column.key] : null;
      }));
    }
    return out;
  }

  function draw() {
    for (const group of groups) {
      const shape = layout(group);
      const existing = charts[group.id];
      if (!shape.columns.length) {
        if (existing) { existing.plot.destroy(); delete charts[group.id]; }
        continue;
      }
      const box = chartBox(group);
      const signature = shape.series.map(function (s) { return s.label; }).join("|");
      const values = data(shape.columns);
      if (!HAS_UPLOT) {
        charts[group.id] = { plot: tableChart(box, shape.series, values), signature: signature };
        continue;
      }
      if (existing && existing.signature === signature) {
        existing.plot.setData(values);
        continue;
      }
      if (existing) existing.plot.destroy();
      const width = Math.max(320, box.clientWidth - 16);
      const plot = new uPlot({
        width: width,
        height: 230,
        scales: { x: { time: false } },
        axes: [{ label: "step" }, { label: group.y, size: 60 }],
        series: shape.series,
        bands: shape.bands,
        legend: { live: false },
      }, values, box);
      charts[group.id] = { plot: plot, signature: signature };
    }
  }

  // A chart as a table: a row per step (the newest first, TABLE_ROWS of them), a column per series. It answers
  // what window.stare reads of a uPlot chart (data, series) and the calls draw() and resize make.
  function tableChart(box, series, values) {
    let table = box.querySelector("table.fallback");
    if (!table) {
      table = document.createElement("table");
      table.className = "list fallback";
      box.appendChild(table);
    }
    const rows = [series.map(function (s) { return s.label; })];
    const xs = values[0];
    for (let i = xs.length - 1; i >= Math.max(0, xs.length - TABLE_ROWS); i--) {
      rows.push(values.map(function (column, c) {
        const v = column[i];
        if (v === null || v === undefined) return "—";
        return c === 0 ? String(v) : Number(v).toPrecision(4);
      }));
    }
    table.replaceChildren();
    rows.forEach(function (cells, r) {
      const row = document.createElement("tr");
      for (const text of cells) {
        const cell = document.createElement(r === 0 ? "th" : "td");
        cell.textContent = text;
        row.appendChild(cell);
      }
      table.appendChild(row);
    });
    return {
      data: values,
      series: series,
      setData: function () {},
      setSize: function () {},
      destroy: function () { table.remove(); },
    };
  }

  let pending = false;
  function redraw() {
    if (pending) return;
    pending = true;
    window.requestAnimationFrame(function () { pending = false; draw(); });
  }
  window.addEventListener("resize", function () {
    for (const [id, chart] of Object.entries(charts)) {
      const box = document.getElementById("chart-" + id);
      chart.plot.setSize({ width: Math.max(320, box.clientWidth - 16), height: 230 });
    }
  });

  // ------------------------------------------------------------------------------------ job header

  function renderJob() {
    const status = document.getElementById("status");
    status.textContent = job.status;
    status.className = "status status-" + job.status;
    // A queued job that no live worker can take says why (the job view's `waiting`; pages.py's _waiting_text).
    document.getElementById("waiting").textContent = job.waiting ? " · waiting: " + job.waiting.message : "";
    document.getElementById("step").textContent = String(job.progress.step);
    const entropy = job.entropy || {};
    document.getElementById("entropy-value").textContent =
      typeof entropy.value === "number" ? entropy.value.toFixed(3) : "—";
    const band = document.getElementById("entropy-state");
    band.textContent = entropy.state || "";
    band.className = "band band-" + (entropy.state || "none");
    // Time to collapse and target holding (contract/stability.py), as the job view reports them.
    const parts = [];
    if (typeof entropy.collapse_step === "number") parts.push("collapsed at step " + entropy.collapse_step);
    else if (job.progress.step > 0) parts.push("not collapsed");
    if (typeof entropy.target_hold_fraction === "number") {
      parts.push("held ±25 % of target " + Math.round(100 * entropy.target_hold_fraction) + " % of " +
        entropy.post_gate_steps + " post-gate steps");
    }
    document.getElementById("entropy-stability").textContent = parts.length ? "· " + parts.join(" · ") : "";
    renderControl(job.control);
    const systemFault = job.status === "failed" && job.error && job.error.category === "system";
    const enabled = {
      pause: job.status === "queued" || job.status === "running",
      resume: job.status === "paused" || job.status === "pausing" || systemFault,
      cancel: TERMINAL.indexOf(job.status) < 0 && job.status !== "cancelling",
    };
    for (const button of document.querySelectorAll("button[data-action]")) {
      button.disabled = !enabled[button.dataset.action];
    }
  }

  // The PI entropy law's state at the latest step (the job view's `control`; null: the job has none).
  function renderControl(control) {
    const box = document.getElementById("control");
    if (!box) return;
    if (!control) {
      box.textContent = "";
      box.className = "";
      return;
    }
    function num(v, digits) { return typeof v === "number" ? v.toFixed(digits) : "—"; }
    let text = "· controller " + control.law + ": u " + num(control.output, 3) + " · e " +
      num(control.error, 3) + " · I " + num(control.integral, 2) + " · actuator " + num(control.actuator, 3);
    if (typeof control.saturated_steps === "number" && control.saturated_steps > 0) {
      text += " · at its clip " + control.saturated_steps + " steps";
    }
    if (control.saturated) text += " — saturated: the target cannot be held with this actuator";
    box.textContent = text;
    box.className = control.saturated ? "control control-saturated" : "control";
  }

  // ------------------------------------------------------------------- warnings and samples (issue 46)

  // GET /v1/jobs/{id} carries them (the live stream's job object does not): read again when the stream
  // says a samples or warning event was written, and at the end. Text only (textContent): tenant data.
  async function loadNotes() {
    const response = await fetch("/v1/jobs/" + jobId, { headers: { Accept: "application/json" } });
    if (!response.ok) return;
    const view = await response.json();
    state.notes = { warnings: view.warnings || [], samples: view.samples || null };
    renderWarnings(state.notes.warnings);
    renderSamples(state.notes.samples);
  }

  function element(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = text;
    if (className) node.className = className;
    return node;
  }

  function renderWarnings(warnings) {
    const list = document.getElementById("warnings");
    list.replaceChildren();
    for (const w of warnings) {
      const held = typeof w.step === "number" ? " (steps " + w.first_step + "–" + w.step + ", " + w.count + "×)" : "";
      const item = element("li", undefined, "warning warning-" + w.kind);
      item.append(element("b", w.kind), document.createTextNode(held + ": " + w.message));
      list.append(item);
    }
  }

  function renderSamples(samples) {
    const box = document.getElementById("samples");
    box.replaceChildren();
    const sets = [["Evaluation", samples && samples.eval], ["Training", samples && samples.train]];
    for (const [title, set] of sets) {
      if (!set || !set.samples.length) continue;
      box.append(element("h2", title + " samples (step " + set.step + ")"));
      const table = element("table", undefined, "list samples");
      const head = element("tr");
      for (const name of ["prompt", "completion", "reference", "reward"]) head.append(element("th", name));
      table.append(head);
      for (const s of set.samples) {
        const row = element("tr");
        const completion = element("td");
        completion.append(element("pre", s.completion));
        if (s.truncated) completion.append(element("span", "cut at max_new_tokens", "cut"));
        const prompt = element("td");
        prompt.append(element("pre", s.prompt));
        const reference = element("td");
        reference.append(element("pre", s.reference === null ? "—" : s.reference));
        row.append(prompt, completion, reference, element("td", String(Number(s.reward.toFixed(3)))));
        table.append(row);
      }
      box.append(table);
    }
  }

  async function act(action) {
    const shown = document.getElementById("action-error");
    shown.textContent = "";
    const response = await fetch("/v1/jobs/" + jobId + "/" + action, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRF-Token": window.stareCsrfToken() },
    });
    if (!response.ok) {
      shown.textContent = await window.stareErrorMessage(response);
      return;
    }
    job = await response.json();
    renderJob();
  }

  // ----------------------------------------------------------------------------------- checkpoints

  function size(bytes) {
    if (typeof bytes !== "number") return "—";
    const units = ["B", "KiB", "MiB", "GiB"];
    let value = bytes;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
    return value.toFixed(unit ? 1 : 0) + " " + units[unit];
  }

  async function loadCheckpoints() {
    const response = await fetch("/v1/jobs/" + jobId + "/checkpoints", { credentials: "same-origin" });
    if (!response.ok) return;
    const listing = await response.json();
    state.checkpoints = listing.data;
    const body = document.querySelector("#checkpoints tbody");
    body.replaceChildren();
    for (const ckpt of listing.data) {
      const row = document.createElement("tr");
      row.dataset.checkpointId = ckpt.id;
      const entropy = ckpt.metrics && typeof ckpt.metrics["entropy/mean"] === "number"
        ? ckpt.metrics["entropy/mean"].toFixed(3) : "—";
      for (const text of [String(ckpt.step), ckpt.created_at.replace("T", " ").slice(0, 19), size(ckpt.bytes), entropy]) {
        const cell = document.createElement("td");
        cell.textContent = text;
        row.appendChild(cell);
      }
      const cell = document.createElement("td");
      const link = document.createElement("a");
      link.href = ckpt.download_url;
      link.textContent = "download";
      link.className = "download";
      link.setAttribute("download", "");
      cell.appendChild(link);
      row.appendChild(cell);
      body.appendChild(row);
    }
  }

  // --------------------------------------------------------------------------------------- overlays

  async function loadJobChoices() {
    const response = await fetch("/v1/jobs?limit=100", { credentials: "same-origin" });
    if (!response.ok) return;
    const select = document.getElementById("overlay-job");
    for (const other of (await response.json()).data) {
      if (other.id === jobId) continue;
      const option = document.createElement("option");
      option.value = other.id;
      option.textContent = other.id + (other.name ? " · " + other.name : "") + " · " + other.algorithm + " · " + other.status;
      option.dataset.label = other.name || other.id;
      select.appendChild(option);
    }
  }

  async function overlay() {
    const select = document.getElementById("overlay-job");
    const id = select.value;
    if (!id || runs.some(function (run) { return run.id === id; })) return;
    const label = select.selectedOptions[0].dataset.label;
    const response = await fetch("/v1/jobs/" + id + "/metrics?limit=100000", { credentials: "same-origin" });
    if (!response.ok) {
      document.getElementById("action-error").textContent = await window.stareErrorMessage(response);
      return;
    }
    const run = { id: id, label: label, steps: new Map(), keys: new Set(), main: false };
    addPoints(run, (await response.json()).data);
    runs.push(run);
    const tag = document.createElement("span");
    tag.textContent = "+ " + label;
    document.getElementById("overlays").appendChild(tag);
    draw();
  }

  // ----------------------------------------------------------------------------------------- stream

  function follow() {
    const source = new EventSource("/v1/jobs/" + jobId + "/live");
    source.addEventListener("metrics", function (event) {
      const points = JSON.parse(event.data).data;
      addPoints(runs[0], points);
      state.received += points.length;
      state.streamEvents++;
      redraw();
    });
    source.addEventListener("job", function (event) {
      job = JSON.parse(event.data);
      state.streamEvents++;
      renderJob();
    });
    source.addEventListener("lifecycle", function (event) {
      const item = JSON.parse(event.data);
      state.streamEvents++;
      if (item.type.indexOf("checkpoint") === 0) loadCheckpoints();
      if (item.type.indexOf("samples.") === 0 || item.type.indexOf("warning.") === 0) loadNotes();
    });
    source.addEventListener("end", function () {
      state.ended = true;
      source.close();
      loadCheckpoints();
      loadNotes();
    });
    source.addEventListener("error", function () {
      if (source.readyState === EventSource.CLOSED && !state.ended) {
        document.getElementById("action-error").textContent =
          "the live stream closed (signed out?): reload the page";
      }
    });
  }

  for (const button of document.querySelectorAll("button[data-action]")) {
    button.addEventListener("click", function () { act(button.dataset.action); });
  }
  document.getElementById("overlay-add").addEventListener("click", overlay);
  renderJob();
  loadNotes();
  loadCheckpoints();
  loadJobChoices();
  follow();
})();
