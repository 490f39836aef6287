// Drive JupyterLab in headless Chromium the way a person would: open a notebook, check the kernel,
// poke the profile form, Run -> Run All Cells, wait for the last cell, read the summary table from the
// DOM and take screenshots. Started by tests/lab/test_jupyter_ui.py, which runs the JupyterLab server.
//
// Environment:
//   JUPYTER_URL      http://127.0.0.1:<port>          (required)
//   JUPYTER_TOKEN    the server's token                 (required)
//   NOTEBOOK         notebook path relative to the JupyterLab root (required)
//   KERNEL_DISPLAY   expected kernel display name       (default "Python (runbook)")
//   ARTIFACTS        directory for screenshots          (default ./test-artifacts)
//   CHROMIUM         browser executable                 (default /usr/bin/chromium)
//   RUN_TIMEOUT_S    seconds allowed for Run All        (default 150)
// Prints one JSON line (prefixed "RESULT ") with what it saw; exits 0 unless the browser part broke. The browser,
// the notebook's opening and the kernel's settling are jupyter_page.mjs's.
import { startBrowser } from "./jupyter_page.mjs";

const runTimeout = 1000 * Number(process.env.RUN_TIMEOUT_S || 150);
const { page, result, step, shot, openNotebook, runAll, finish, t0 } = await startBrowser();

// Open "runtime and serve", type an invalid MAX_NUM_SEQS, see the message under that key, undo; what was seen goes
// into result.form.
async function checkForm(form) {
  result.form.status = (await form.locator(".runbook-form-status").innerText()).trim();
  const headers = form.locator(".jupyter-widget-Collapse-header");
  result.form.sections = (await headers.allInnerTexts()).map((t) => t.trim());
  const title = headers.filter({ hasText: "runtime and serve" }).first();
  const titleHandle = await title.elementHandle();
  await title.click();
  const input = form.locator(".runbook-key-MAX_NUM_SEQS input").first();
  await input.scrollIntoViewIfNeeded();
  await input.fill("0");
  await input.press("Enter");
  const err = form.locator(".runbook-key-MAX_NUM_SEQS").locator("xpath=../..").locator(".runbook-form-error");
  await page.waitForFunction(
    () => [...document.querySelectorAll(".runbook-form-error")].some((e) => e.innerText.includes("out of range")),
    null, { timeout: 20_000 });
  result.form.error = (await err.innerText()).trim();
  result.form.sections_after_edit = (await headers.allInnerTexts()).map((t) => t.trim());
  result.form.status_after_edit = (await form.locator(".runbook-form-status").innerText()).trim();
  await shot("jupyter_ui_form.png");
  await input.fill("8");
  await input.press("Enter");
  await page.waitForFunction(
    // "1 problem(s) (the same validation as …)" contains "valid" too: wait for the status to start with it
    () => (document.querySelector(".runbook-form-status")?.innerText || "").trim().startsWith("valid") &&
          ![...document.querySelectorAll(".runbook-form-error")].some((e) => e.innerText.trim()),
    null, { timeout: 20_000 });
  result.form.status_after_undo = (await form.locator(".runbook-form-status").innerText()).trim();
  await titleHandle.click();      // collapse again
}

try {
  await openNotebook();

  // ---------------------------------------------------------------- Run -> Run All Cells
  await runAll();

  // wait: every cell left the queue ([*]) and either the last code cell has a number or an error showed
  const state = () => page.evaluate(() => {
    const nb = document.querySelector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook");
    const cells = [...nb.querySelectorAll(".jp-CodeCell")];
    const prompts = cells.map((c) => (c.querySelector(".jp-InputArea-prompt")?.textContent || "").trim());
    const errors = [...nb.querySelectorAll(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")]
      .map((e) => e.textContent).filter((t) => /Error|Traceback/.test(t));
    const ind = document.querySelector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator");
    return { prompts, errors, status: ind ? ind.getAttribute("data-status") : "" };
  });
  let s;
  for (;;) {
    s = await state();
    const busy = s.prompts.some((p) => p.includes("*"));
    const lastDone = /\[\d+\]/.test(s.prompts[s.prompts.length - 1] || "");
    if (!busy && s.status === "idle" && (lastDone || s.errors.length)) break;
    if (Date.now() - t0 > runTimeout) throw new Error(`Run All did not finish: prompts ${JSON.stringify(s.prompts)}`);
    await page.waitForTimeout(1000);
  }
  result.prompts = s.prompts;
  result.errors = s.errors.map((e) => e.slice(-2000));
  step("Run All finished");

  // ---------------------------------------------------------------- what the notebook printed
  result.evidence = await page.evaluate(() => {
    const outs = document.querySelectorAll(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output");
    for (const o of outs) {
      const m = o.innerText.match(/evidence in (\/\S+)/);
      if (m) return m[1];
    }
    return "";
  });

  // ---------------------------------------------------------------- the profile form, as a person uses it
  const form = page.locator(".runbook-profile-form");
  result.form = { present: (await form.count()) > 0 };
  if (result.form.present) {
    try {
      await checkForm(form);
    } catch (err) {
      // ipywidgets' page side can lose some of the form's ~1,500 widget models on a loaded machine ("Error: widget
      // model not found": a row or a section stays empty); docs/jupyterlab.md tells a person to run the form cell
      // again, and so does this script, once, and only for that error. The second form must then work in full.
      if (!result.console_errors.some((e) => e.includes("widget model not found"))) throw err;
      result.form.rerun = { first_attempt: String(err).split("\n")[0].slice(0, 300) };
      await shot("jupyter_ui_form_lost_models.png");
      step("the form lost widget models: running the form cell again");
      const formCell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell", { hasText: "runbook.form.show" }).first();
      const before = (await formCell.locator(".jp-InputArea-prompt").innerText()).trim();
      await formCell.locator(".jp-InputArea-prompt").click();
      await page.keyboard.press("Control+Enter");
      await page.waitForFunction(([sel, old]) => {
        const cell = [...document.querySelectorAll(sel)].find((c) => c.textContent.includes("runbook.form.show"));
        const prompt = (cell?.querySelector(".jp-InputArea-prompt")?.textContent || "").trim();
        return /\[\d+\]/.test(prompt) && prompt !== old &&
               cell.querySelectorAll(".runbook-profile-form .jupyter-widget-Collapse-header").length > 0;
      }, [".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell", before], { timeout: 60_000 });
      result.form = { present: true, rerun: result.form.rerun };
      await checkForm(formCell.locator(".runbook-profile-form"));
    }
    step("profile form checked");
  }

  // ---------------------------------------------------------------- the summary table
  const cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell");
  const last = cells.nth((await cells.count()) - 1);
  const table = last.locator(".jp-OutputArea-output table").first();
  if (await table.count()) {
    await table.scrollIntoViewIfNeeded();
    result.table = await table.evaluate((t) => {
      const head = [...t.querySelectorAll("thead tr:last-child th")].map((th) => th.innerText.trim());
      const rows = [...t.querySelectorAll("tbody tr")].map((tr) =>
        [...tr.querySelectorAll("td")].map((td) => td.innerText.trim()));
      const shift = head.length - (rows[0] || []).length;     // hidden index headers, if any
      const cols = head.slice(Math.max(shift, 0));
      return rows.map((r) => Object.fromEntries(cols.map((c, i) => [c, r[i]])));
    });
    // the table's top a little below the top of the viewport, for the screenshot
    await table.evaluate((t) => t.scrollIntoView({ block: "start" }));
    await page.waitForTimeout(300);
  } else {
    result.table = null;
  }
  await shot("jupyter_ui_summary.png");
  step("done");
} catch (err) {
  result.failure = String(err && err.stack || err).slice(0, 3000);
  await shot("jupyter_ui_failure.png").catch(() => {});
}
await finish();
