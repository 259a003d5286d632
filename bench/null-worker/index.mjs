// The platform alone in `cargo xtask bench`: a worker that answers every request at once, with
// no fetch and no work. Its latencies are workerd's own (accepting, parsing, scheduling the
// isolate, answering); what the other workers add sits on top. Its tail shows the pauses
// workerd makes by itself, which every worker in the same run shares.
export default {
  async fetch() {
    return new Response('{"result":"PONG"}', { headers: { "Content-Type": "application/json" } });
  },
};
