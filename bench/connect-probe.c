// The client and the server of bench/connect.ts (npm run bench:connect),
// compiled with gcc into .cache/ when the benchmark starts.
//
// In C because the thing measured is ~15 us: Node's net.connect is a
// non-blocking connect, an epoll wake-up of libuv's loop and a JavaScript
// callback, which adds more than the connect itself, with jitter from the
// event loop and the GC on top (figures in bench/connect.ts). Here connect()
// blocks and the clock is read right around it: on veth pairs the whole
// handshake (SYN through the node, SYN-ACK back, the ACK) is processed within
// that one system call.
//
//   connect-probe serve PORT
//       listens on PORT; echoes what each connection sends until it ends.
//       Prints "ready" once listening.
//   connect-probe run COUNT BLOCK WARMUP SIZE CASE...
//       CASE is connect:NETNS:ADDR:PORT or rtt:NETNS:ADDR:PORT, NETNS a path
//       such as /run/netns/NAME. Measures every case COUNT times, in rounds:
//       BLOCK samples of each case in turn, each round starting one case
//       further, so that every case meets the machine's changing speed alike
//       (its bands last seconds; a round takes milliseconds). Each block
//       starts with one operation not kept (its rules may have left the
//       caches while the other cases ran), the whole run with WARMUP per
//       case. Prints "CASE_INDEX NANOSECONDS" per sample.
//       connect: a new socket, created in NETNS (setns), connect() timed,
//       closed with a RST (SO_LINGER 0: no TIME_WAIT left behind, and
//       conntrack's entry goes to CLOSE).
//       rtt: one connection opened at the start (TCP_NODELAY); an exchange
//       of SIZE bytes sent and echoed back timed.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void die(const char *what, const char *detail) {
  fprintf(stderr, "connect-probe: %s%s%s: %s\n", what, detail ? " " : "", detail ? detail : "", strerror(errno));
  exit(1);
}

static void usage(void) {
  fprintf(stderr,
          "usage: connect-probe serve PORT\n"
          "       connect-probe run COUNT BLOCK WARMUP SIZE CASE...   (CASE: connect|rtt:NETNS:ADDR:PORT)\n");
  exit(2);
}

static long number(const char *s, long min, long max) {
  char *end;
  errno = 0;
  long n = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || errno || n < min || n > max) {
    fprintf(stderr, "connect-probe: not a number in %ld..%ld: %s\n", min, max, s);
    exit(2);
  }
  return n;
}

static void set(int s, int level, int name, const void *value, socklen_t len) {
  if (setsockopt(s, level, name, value, len) != 0) die("setsockopt", NULL);
}

static _Noreturn void serve(long port) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  if (l < 0) die("socket", NULL);
  int one = 1;
  set(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // A connection is handed to accept() only once data arrives: the connect
  // cases' connections, which send none, never wake this process, so no
  // wake-up of the server lands on the client's CPU inside its connect().
  int defer = 5;
  set(l, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof defer);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (bind(l, (struct sockaddr *)&a, sizeof a) != 0) die("bind", NULL);
  if (listen(l, 4096) != 0) die("listen", NULL);
  printf("ready\n");
  fflush(stdout);
  static char buf[65536];
  for (;;) {
    int c = accept(l, NULL, NULL);
    if (c < 0) continue;
    set(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // An idle connection must not keep the next one waiting for ever.
    struct timeval tv = {.tv_sec = 5};
    set(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (;;) {
      ssize_t n = read(c, buf, sizeof buf);
      if (n <= 0 || write(c, buf, (size_t)n) != n) break;
    }
    close(c);
  }
}

struct probe_case {
  const char *spec;
  int rtt;
  int netns;
  struct sockaddr_in to;
  int conn;
  uint64_t *samples;
};

/** Parses kind:NETNS:ADDR:PORT (in place) and opens NETNS. */
static void parse_case(struct probe_case *c, char *spec) {
  c->spec = strdup(spec);
  char *kind = strtok(spec, ":"), *ns = strtok(NULL, ":"), *addr = strtok(NULL, ":"), *port = strtok(NULL, ":");
  if (!kind || !ns || !addr || !port || strtok(NULL, ":")) usage();
  if (strcmp(kind, "rtt") == 0) c->rtt = 1;
  else if (strcmp(kind, "connect") != 0) usage();
  c->netns = open(ns, O_RDONLY | O_CLOEXEC);
  if (c->netns < 0) die("open", ns);
  c->to = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)number(port, 1, 65535))};
  if (inet_pton(AF_INET, addr, &c->to.sin_addr) != 1) {
    fprintf(stderr, "connect-probe: not an IPv4 address: %s\n", addr);
    exit(2);
  }
  c->conn = -1;
}

/** A blocking socket in the case's namespace that gives up after 2 s: a dropped SYN must fail the run, not hang it. */
static int case_socket(const struct probe_case *c) {
  if (setns(c->netns, CLONE_NEWNET) != 0) die("setns", c->spec);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) die("socket", c->spec);
  struct timeval tv = {.tv_sec = 2};
  set(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  set(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return s;
}

static uint64_t connect_once(const struct probe_case *c) {
  static const struct linger reset = {.l_onoff = 1, .l_linger = 0};
  int s = case_socket(c);
  set(s, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  uint64_t t0 = now_ns();
  if (connect(s, (const struct sockaddr *)&c->to, sizeof c->to) != 0) die("connect", c->spec);
  uint64_t t = now_ns() - t0;
  close(s);
  return t;
}

static uint64_t exchange(const struct probe_case *c, char *buf, long size) {
  uint64_t t0 = now_ns();
  if (write(c->conn, buf, (size_t)size) != size) die("write", c->spec);
  for (long got = 0; got < size;) {
    ssize_t n = read(c->conn, buf + got, (size_t)(size - got));
    if (n <= 0) {
      if (n == 0) errno = ECONNRESET;
      die("read", c->spec);
    }
    got += n;
  }
  return now_ns() - t0;
}

static uint64_t once(const struct probe_case *c, char *buf, long size) {
  return c->rtt ? exchange(c, buf, size) : connect_once(c);
}

static int run(long count, long block, long warmup, long size, int n, char **specs) {
  struct probe_case *cases = calloc((size_t)n, sizeof *cases);
  char *buf = calloc((size_t)size, 1);
  if (!cases || !buf) die("calloc", NULL);
  for (int i = 0; i < n; i++) {
    struct probe_case *c = &cases[i];
    parse_case(c, specs[i]);
    c->samples = calloc((size_t)count, sizeof *c->samples);
    if (!c->samples) die("calloc", NULL);
    if (!c->rtt) continue;
    c->conn = case_socket(c);
    int one = 1;
    set(c->conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->conn, (const struct sockaddr *)&c->to, sizeof c->to) != 0) die("connect", c->spec);
  }
  for (int i = 0; i < n; i++)
    for (long k = 0; k < warmup; k++) once(&cases[i], buf, size);
  long done = 0;
  for (long round = 0; done < count; round++) {
    long take = count - done < block ? count - done : block;
    for (int j = 0; j < n; j++) {
      const struct probe_case *c = &cases[(round + j) % n];
      once(c, buf, size);
      for (long k = 0; k < take; k++) c->samples[done + k] = once(c, buf, size);
    }
    done += take;
  }
  for (int i = 0; i < n; i++)
    for (long k = 0; k < count; k++) printf("%d %llu\n", i, (unsigned long long)cases[i].samples[k]);
  if (fflush(stdout) != 0) die("stdout", NULL);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "serve") == 0) serve(number(argv[2], 1, 65535));
  if (argc >= 7 && strcmp(argv[1], "run") == 0)
    return run(number(argv[2], 1, 10000000), number(argv[3], 1, 10000000), number(argv[4], 0, 10000000), number(argv[5], 1, 65536), argc - 6, argv + 6);
  usage();
}
