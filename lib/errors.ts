// Errors pier explains itself: the CLI prints their message on one line,
// where anything else is a bug and keeps its stack.
export class ExplainedError extends Error {}
