// The live log's backpressure. Every output chunk of an execute goes to Paperclip's live log as
// one JSON-RPC notification on the worker's stdout (the SDK's ctx.execution.log), which the SDK
// writes without waiting: when Paperclip's host reads slower than a command prints, the
// notifications queue in the worker's memory, and one 64 MiB execute held hundreds of MiB there
// while the host was busy. So a chunk is left out of the live log while the worker's unread
// stdout (process.stdout.writableLength) is over a bound, and the first chunk sent after such a
// gap is preceded by one line saying how much was left out. Nothing is lost from the command's
// result: it holds the head and tail of each stream as before (settings.maxExecuteOutputBytes).

/** Unread worker output (bytes) over which live-log chunks are left out. */
export const LIVE_LOG_BACKLOG_BYTES = 8 << 20;

export type Stream = "stdout" | "stderr";

export class LiveLog {
  private readonly skipped: Record<Stream, number> = { stdout: 0, stderr: 0 };

  /**
   * send delivers a chunk to the live log; backlog is the worker's unread output now (bytes);
   * limit the bound.
   */
  constructor(
    private readonly send: (stream: Stream, chunk: string) => void,
    private readonly backlog: () => number,
    private readonly limit = LIVE_LOG_BACKLOG_BYTES,
  ) {}

  /** Characters left out so far and not yet reported, per stream. */
  get pending(): Readonly<Record<Stream, number>> {
    return this.skipped;
  }

  write(stream: Stream, chunk: string): void {
    if (this.backlog() > this.limit) {
      this.skipped[stream] += chunk.length;
      return;
    }
    this.report(stream);
    this.send(stream, chunk);
  }

  /** Reports what is still left out (the command ended during a gap). */
  finish(): void {
    if (this.backlog() > this.limit) return; // one more line would only queue behind the rest
    this.report("stdout");
    this.report("stderr");
  }

  private report(stream: Stream): void {
    const n = this.skipped[stream];
    if (n === 0) return;
    this.skipped[stream] = 0;
    this.send(
      stream,
      `\n[kubeclip: ${n} characters of output left out of the live log here: Paperclip's host was not reading it as fast as the command printed; the command's result holds its head and tail]\n`,
    );
  }
}
