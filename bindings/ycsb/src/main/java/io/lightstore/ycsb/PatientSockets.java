package io.lightstore.ycsb;

import java.io.FilterInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisSocketFactory;
import redis.clients.jedis.exceptions.JedisConnectionException;

/**
 * Sockets to one node whose reads tell a slow node from a dead one, as the
 * Rust client's connections do (crates/client/src/conn.rs, busy_not_down).
 *
 * <p>A read that gets no byte within the call timeout probes the node: a
 * {@code PING} on a fresh connection, answered within min(timeout / 2, 1 s).
 * Any reply (an error such as {@code NOAUTH} included) shows that the node's
 * network thread serves, so the node is busy (its disk stalls a write, say),
 * not down, and the read waits on, until the call has waited
 * {@code busyTimeoutMs} in all. No reply, or a call past that, ends the read
 * with the timeout as before, and the caller marks the node down.
 *
 * <p>Waiting happens at the byte stream, below Jedis's reply parser, so a
 * reply that is late in the middle is read whole, never half-parsed twice.
 * One factory serves one connection ({@link #callStarted} marks the start of
 * each of its calls); not for use by several threads at once.
 */
final class PatientSockets implements JedisSocketFactory {
  /** Longest wait for a probe's answer. */
  static final int PROBE_WAIT_MS = 1000;

  private final HostAndPort node;
  private final int timeoutMs;
  private final long busyTimeoutNanos;
  private long callStartNanos = System.nanoTime();

  /**
   * Sockets to {@code node} whose reads time out at {@code timeoutMs}, and
   * wait on up to {@code busyTimeoutMs} per call while the node answers
   * probes ({@code busyTimeoutMs <= timeoutMs}: never).
   */
  PatientSockets(HostAndPort node, int timeoutMs, int busyTimeoutMs) {
    this.node = node;
    this.timeoutMs = timeoutMs;
    this.busyTimeoutNanos = busyTimeoutMs > timeoutMs ? busyTimeoutMs * 1_000_000L : 0;
  }

  /** Marks the start of a call: its reads wait on at most busyTimeoutMs from now. */
  void callStarted() {
    callStartNanos = System.nanoTime();
  }

  @Override
  public Socket createSocket() throws JedisConnectionException {
    Socket s = new PatientSocket();
    try {
      s.setReuseAddress(true);
      s.setKeepAlive(true);
      s.setTcpNoDelay(true);
      s.setSoLinger(true, 0);
      s.connect(new InetSocketAddress(node.getHost(), node.getPort()), timeoutMs);
      s.setSoTimeout(timeoutMs);
      return s;
    } catch (IOException e) {
      try {
        s.close();
      } catch (IOException ignored) {
        // Nothing more to release.
      }
      throw new JedisConnectionException("Failed to connect to " + node, e);
    }
  }

  /** Whether a read that timed out may wait on: within the budget and the node answers. */
  private boolean busyNotDown() {
    if (busyTimeoutNanos == 0 || System.nanoTime() - callStartNanos >= busyTimeoutNanos) {
      return false;
    }
    return answers(node, Math.min(timeoutMs / 2, PROBE_WAIT_MS));
  }

  /** Whether {@code node} answers a PING on a fresh connection within {@code waitMs}. */
  static boolean answers(HostAndPort node, int waitMs) {
    try (Socket s = new Socket()) {
      s.connect(new InetSocketAddress(node.getHost(), node.getPort()), Math.max(waitMs, 1));
      s.setSoTimeout(Math.max(waitMs, 1));
      OutputStream out = s.getOutputStream();
      out.write("*1\r\n$4\r\nPING\r\n".getBytes(StandardCharsets.US_ASCII));
      out.flush();
      int first = s.getInputStream().read();
      return first == '+' || first == '-';
    } catch (IOException e) {
      return false;
    }
  }

  /** A socket whose input stream waits on a busy node. */
  private final class PatientSocket extends Socket {
    private InputStream in;

    @Override
    public synchronized InputStream getInputStream() throws IOException {
      if (in == null) {
        in = new PatientInput(super.getInputStream());
      }
      return in;
    }
  }

  /** Reads that retry a timeout while the node is busy, not down. */
  private final class PatientInput extends FilterInputStream {
    PatientInput(InputStream in) {
      super(in);
    }

    @Override
    public int read() throws IOException {
      while (true) {
        try {
          return in.read();
        } catch (SocketTimeoutException e) {
          if (!busyNotDown()) {
            throw e;
          }
        }
      }
    }

    @Override
    public int read(byte[] b, int off, int len) throws IOException {
      while (true) {
        try {
          return in.read(b, off, len);
        } catch (SocketTimeoutException e) {
          if (!busyNotDown()) {
            throw e;
          }
        }
      }
    }
  }
}
