// The console's live tail (the Calls page): new calls arrive over server-sent events and are put
// at the top of the table. Without JavaScript the page is a plain table; reload it for new calls.
(function () {
  "use strict";
  const state = document.getElementById("tail-state");
  const rows = document.getElementById("call-rows");
  if (!state || !rows || !window.EventSource) return;
  const prefix = state.dataset.stream.split("/calls/stream")[0];
  const keep = 200;
  const params = new URLSearchParams(window.location.search);
  if (params.get("before")) { state.textContent = "Older calls: the live tail shows on the first page."; return; }
  const url = state.dataset.stream + (state.dataset.stream.includes("?") ? "&" : "?") + "after=" + state.dataset.after;
  const source = new EventSource(url);
  let seen = 0;
  const cell = (text, cls) => { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; };
  source.onopen = () => { state.textContent = "Live: new calls appear at the top."; state.dataset.live = "on"; };
  source.onerror = () => { state.textContent = "Live tail reconnecting…"; state.dataset.live = "off"; };
  source.addEventListener("dropped", (event) => { state.textContent = "Live: the browser fell behind; " + event.data + " calls were skipped."; });
  source.onmessage = (event) => {
    const call = JSON.parse(event.data);
    const tr = document.createElement("tr");
    tr.className = call.status + " fresh";
    tr.dataset.id = call.id;
    const when = document.createElement("td");
    const link = document.createElement("a");
    link.href = prefix + "/calls/" + encodeURIComponent(call.id);
    link.textContent = new Date(call.at * 1000).toISOString().replace("T", " ").slice(0, 19);
    when.appendChild(link);
    const status = document.createElement("td");
    const badge = document.createElement("span");
    badge.className = "status " + call.status;
    badge.textContent = call.status;
    status.appendChild(badge);
    if (call.code) status.appendChild(document.createTextNode(" " + call.code));
    tr.append(when, cell(call.server || "(no server)"), cell(call.tool), status, cell(call.latency_ms.toFixed(1) + " ms"), cell(call.client || ""));
    rows.insertBefore(tr, rows.firstChild);
    seen += 1;
    while (rows.children.length > keep) rows.removeChild(rows.lastChild);
    state.dataset.seen = String(seen);
  };
})();
