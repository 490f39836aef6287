// What every JupyterLab browser script does first, in one place: start headless Chromium on an empty profile,
// open a notebook in a running JupyterLab, take the kernel it asks for, wait until the kernel is idle and the
// widget manager has its state (see below), and take screenshots. Used by jupyter_ui.mjs (preflight, Run All) and
// jupyter_progress.mjs (a progress widget while a long cell runs).
//
// Environment read here:
//   JUPYTER_URL      http://127.0.0.1:<port>          (required)
//   JUPYTER_TOKEN    the server's token                 (required)
//   NOTEBOOK         notebook path relative to the JupyterLab root (required)
//   KERNEL_DISPLAY   expected kernel display name       (default "Python (runbook)")
//   ARTIFACTS        directory for screenshots          (default ./test-artifacts)
//   CHROMIUM         browser executable                 (default /usr/bin/chromium)
import { chromium } from "playwright-core";
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";

// The notebook panel on screen and its parts (JupyterLab 4).
export const PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)";

export async function startBrowser() {
  const env = process.env;
  const base = env.JUPYTER_URL;
  const token = env.JUPYTER_TOKEN;
  const notebook = env.NOTEBOOK;
  if (!base || !token || !notebook) {
    console.error("JUPYTER_URL, JUPYTER_TOKEN and NOTEBOOK are required");
    process.exit(2);
  }
  const artifacts = path.resolve(env.ARTIFACTS || "test-artifacts");
  mkdirSync(artifacts, { recursive: true });

  const t0 = Date.now();
  const log = (msg) => console.error(`[ui ${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}`);
  const result = { steps: [], screenshots: [], console_errors: [] };
  const step = (name) => { result.steps.push({ name, t: (Date.now() - t0) / 1000 }); log(name); };

  const profileDir = mkdtempSync(path.join(tmpdir(), "runbook-chromium-"));   // empty --user-data-dir
  const context = await chromium.launchPersistentContext(profileDir, {
    executablePath: env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage"],
    viewport: { width: 1440, height: 1000 },
  });
  const page = context.pages()[0] || (await context.newPage());
  page.on("console", (m) => { if (m.type() === "error") result.console_errors.push(m.text().slice(0, 300)); });
  page.on("pageerror", (e) => result.console_errors.push(String(e).slice(0, 300)));

  // When the kernel connects, the widget manager asks it for every widget's state: "request_states" on the
  // jupyter.widget.control comm, answered by "update_states" once the kernel has imported ipywidgets, else the
  // comm is closed and the manager falls back to a comm_info_request. Cells that create widgets before that
  // answer meet ipywidgets' own race: the answer lists widgets whose comm_open the page has not handled yet, the
  // manager opens a second comm for them and the form's children are lost ("Error: widget model not found";
  // CI, a loaded 2-core machine, saw it once). A person waits for the page to settle; so does this script.
  const widgetStates = { requested: 0, answered: 0 };
  const frameText = (f) => (typeof f === "string" ? f : Buffer.from(f).toString("latin1"));
  const msgType = (text) => (text.match(/"msg_type":\s*"(\w+)"/) || [])[1];
  page.on("websocket", (ws) => {
    ws.on("framesent", (f) => { if (frameText(f.payload).includes("request_states")) widgetStates.requested++; });
    ws.on("framereceived", (f) => {
      const text = frameText(f.payload);
      if (widgetStates.requested && (text.includes("update_states") || msgType(text) === "comm_info_reply")) {
        widgetStates.answered++;
      }
    });
  });

  async function shot(name) {
    const file = path.join(artifacts, name);
    await page.screenshot({ path: file });
    result.screenshots.push(file);
    log(`screenshot ${file}`);
  }

  // Open the notebook, take the kernel, wait until it is idle and the widget manager has its state.
  async function openNotebook() {
    const kernelDisplay = env.KERNEL_DISPLAY || "Python (runbook)";
    const url = `${base}/lab/tree/${notebook.split("/").map(encodeURIComponent).join("/")}?token=${token}`;
    step("open JupyterLab");
    await page.goto(url, { waitUntil: "domcontentloaded", timeout: 90_000 });
    const panel = page.locator(".jp-NotebookPanel:visible").first();
    await page.locator(".jp-NotebookPanel:visible, .jp-Dialog").first().waitFor({ state: "visible", timeout: 90_000 });
    const opened = page.locator(".jp-Dialog", { hasText: "Cannot open" });
    if (await opened.count()) throw new Error("JupyterLab: " + (await opened.innerText()).replace(/\s+/g, " "));
    await panel.waitFor({ state: "visible", timeout: 90_000 });
    await page.locator(".jp-NotebookPanel:visible .jp-Cell").first().waitFor({ timeout: 60_000 });
    step("notebook open");

    // A kernel picker appears only if the notebook's kernel is unknown; choose the runbook kernel then.
    const dialog = page.locator(".jp-Dialog");
    if (await dialog.isVisible().catch(() => false)) {
      const select = dialog.locator("select");
      if (await select.count()) await select.selectOption({ label: kernelDisplay });
      await dialog.locator("button.jp-mod-accept").click();
    }
    const kernelName = panel.locator(".jp-Toolbar .jp-KernelName, .jp-Toolbar [data-jp-item-name='kernelName']").first();
    await page.waitForFunction(
      (want) => [...document.querySelectorAll(".jp-NotebookPanel .jp-Toolbar")].some((t) => t.textContent.includes(want)),
      kernelDisplay, { timeout: 60_000 });
    result.kernel = (await kernelName.textContent().catch(() => "")).trim();
    // idle: the execution indicator says so once the kernel has started
    await page.waitForFunction((sel) => {
      const ind = document.querySelector(`${sel} .jp-Notebook-ExecutionIndicator`);
      return ind && ind.getAttribute("data-status") === "idle";
    }, PANEL, { timeout: 90_000 });
    step(`kernel ${result.kernel} idle`);
    const settleBy = Date.now() + 30_000;
    while (Date.now() < settleBy && (widgetStates.requested === 0 || widgetStates.answered < widgetStates.requested)) {
      await page.waitForTimeout(200);
    }
    result.widget_states = { ...widgetStates };
    if (widgetStates.requested === 0 || widgetStates.answered < widgetStates.requested) {
      throw new Error(`the widget manager's state request was not answered in 30 s: ${JSON.stringify(widgetStates)}`);
    }
    step(`widget manager restored (${widgetStates.answered}/${widgetStates.requested} state requests answered)`);
  }

  // Run -> Run All Cells, as a person clicks it.
  async function runAll() {
    await page.locator(".lm-MenuBar-itemLabel", { hasText: /^Run$/ }).click();
    await page.locator(".lm-Menu-itemLabel", { hasText: /^Run All Cells$/ }).click();
    step("Run All Cells clicked");
  }

  // The one line the Python side reads, then the exit status: 0 unless the browser part broke.
  async function finish() {
    await context.close().catch(() => {});
    rmSync(profileDir, { recursive: true, force: true });
    result.seconds = (Date.now() - t0) / 1000;
    console.log("RESULT " + JSON.stringify(result));
    process.exit(result.failure ? 1 : 0);
  }

  return { page, result, log, step, shot, openNotebook, runAll, finish, t0 };
}
