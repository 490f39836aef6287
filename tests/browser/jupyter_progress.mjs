// A long cell in JupyterLab shows the progress channel's widget (runbook/progress.py, WidgetSink) while it runs:
// open the notebook (one code cell that drives a real producer), Run All, and while that cell's prompt is still
// [*] read the progress bar in its output area until its count has moved, then wait for the cell's end and read
// the final bar. Started by tests/lab/test_jupyter_ui.py, which runs the JupyterLab server and writes the notebook.
//
// Environment: as jupyter_page.mjs, plus
//   RUN_TIMEOUT_S    seconds allowed for the cell        (default 120)
//   SHOT_PREFIX      screenshot names' prefix            (default "jupyter_progress")
// Prints one JSON line (prefixed "RESULT ") with what it saw; exits 0 unless the browser part broke (a missing
// widget is reported in the result, and the Python side fails on it).
import { PANEL, startBrowser } from "./jupyter_page.mjs";

const runTimeout = 1000 * Number(process.env.RUN_TIMEOUT_S || 120);
const prefix = process.env.SHOT_PREFIX || "jupyter_progress";
const { page, result, step, shot, openNotebook, runAll, finish, t0 } = await startBrowser();

// The cell's prompt and every progress widget in its output area, read in one go (so "while [*]" is true of
// the bars read): the label, the bar's width and style, the figures ipywidgets shows next to the bar.
const read = () => page.evaluate((panel) => {
  const cell = document.querySelector(`${panel} .jp-CodeCell`);
  const prompt = (cell?.querySelector(".jp-InputArea-prompt")?.textContent || "").trim();
  const bars = [...(cell?.querySelectorAll(".jp-OutputArea-output .widget-hprogress") || [])].map((w) => {
    const box = w.closest(".widget-hbox") || w.parentElement;
    const bar = w.querySelector(".progress-bar");
    return {
      label: (w.querySelector(".widget-label")?.textContent || "").trim(),
      width: bar?.style.width || "",
      success: !!bar?.classList.contains("progress-bar-success"),
      figures: [...box.querySelectorAll(":scope > .widget-label")].map((l) => l.textContent.trim()).join(" "),
    };
  });
  const text = [...(cell?.querySelectorAll(".jp-OutputArea-output") || [])]
    .filter((o) => !o.querySelector(".widget-hprogress")).map((o) => o.innerText).join("\n");
  return { prompt, bars, text, t: Date.now() };
}, PANEL);

try {
  await openNotebook();
  await runAll();

  // ---------------------------------------------------------------- while the cell runs
  // Readings taken while the prompt is [*] and a bar is shown with its figures; done when two of them differ in
  // their figures. A bar whose figures are still empty is mid-render (ipywidgets sets the bar's width and the label
  // beside it in separate DOM updates: CI once read width 6.2% with no label yet), so it is read again.
  result.running = [];
  let s;
  for (;;) {
    s = await read();
    const busy = s.prompt.includes("*");
    if (busy && s.bars.length && s.bars[0].figures) {
      const seen = result.running;
      if (!seen.length || seen[seen.length - 1].bars[0].figures !== s.bars[0].figures) seen.push(s);
      if (seen.length === 2) {
        step(`the bar moved while [*]: "${seen[0].bars[0].figures}" -> "${seen[1].bars[0].figures}"`);
        await shot(`${prefix}_running.png`);
        break;
      }
    }
    if (!busy && /\[\d+\]/.test(s.prompt)) {
      step(`the cell ended (${s.prompt}) before its bar was seen moving`);
      break;
    }
    if (Date.now() - t0 > runTimeout) throw new Error(`the cell did not end: prompt ${s.prompt}`);
    await page.waitForTimeout(250);
  }

  // ---------------------------------------------------------------- the end
  for (;;) {
    s = await read();
    if (/\[\d+\]/.test(s.prompt)) break;
    if (Date.now() - t0 > runTimeout) throw new Error(`the cell did not end: prompt ${s.prompt}`);
    await page.waitForTimeout(500);
  }
  result.final = s;
  result.errors = s.text.match(/Traceback|Error/) ? [s.text.slice(-2000)] : [];
  step(`the cell ended (${s.prompt}): ${s.bars.map((b) => b.figures).join("; ")}`);
  await page.locator(`${PANEL} .jp-CodeCell`).first().evaluate((c) => c.scrollIntoView({ block: "start" }));
  await page.waitForTimeout(300);
  await shot(`${prefix}_done.png`);
  step("done");
} catch (err) {
  result.failure = String(err && err.stack || err).slice(0, 3000);
  await shot(`${prefix}_failure.png`).catch(() => {});
}
await finish();
