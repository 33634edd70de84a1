// Drives `parley agui` with the real AG-UI client (@ag-ui/client's HttpAgent), as a front end
// would: a user message, then a wrong answer to the interrupt the run ended with, then the
// right one. Prints one JSON object: what each run gave the client.
// Usage: node drive.mjs URL TOKEN THREAD
import { HttpAgent } from "@ag-ui/client";

const [url, token, threadId] = process.argv.slice(2);
const agent = new HttpAgent({ url, threadId, headers: { Authorization: `Bearer ${token}` } });

async function run(params) {
  const seen = { types: [], text: "", error: null, outcome: null };
  const subscriber = {
    onEvent: ({ event }) => { seen.types.push(event.type); },
    onTextMessageContentEvent: ({ event }) => { seen.text += event.delta; },
    onRunFinishedEvent: (params) => { seen.outcome = params.outcome; },
    onRunErrorEvent: ({ event }) => { seen.error = { code: event.code, message: event.message }; },
  };
  try {
    await agent.runAgent(params, subscriber);
  } catch (err) {
    seen.thrown = String(err && err.message || err);
  }
  seen.pending = agent.pendingInterrupts;
  seen.messages = agent.messages.map((m) => ({ id: m.id, role: m.role, content: m.content ?? null,
    toolCalls: (m.toolCalls || []).map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments })),
    toolCallId: m.toolCallId ?? null }));
  seen.state = agent.state;
  return seen;
}

agent.addMessage({ id: "u-1", role: "user", content: "Pay acme's invoice of 120 EUR" });
const first = await run({ runId: "js-run-1" });
const interrupt = agent.pendingInterrupts[0];
const wrong = await run({ runId: "js-run-2", resume: [
  { interruptId: interrupt.id, status: "resolved", payload: { approved: "yes" } }] });
const right = await run({ runId: "js-run-3", resume: [
  { interruptId: interrupt.id, status: "resolved", payload: { approved: true } }] });
process.stdout.write(JSON.stringify({ first, wrong, right }) + "\n");
