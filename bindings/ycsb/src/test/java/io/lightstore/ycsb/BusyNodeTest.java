package io.lightstore.ycsb;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * A node that is slow but answers probes is waited for; one that answers
 * nothing is given up at the call timeout (the Rust client's tests
 * a_busy_node_that_answers_probes_is_waited_for and
 * a_node_that_answers_no_probe_is_given_up_at_the_call_timeout).
 */
class BusyNodeTest {
  /**
   * A fake node: its first connection (the client's) answers every command
   * but CLIENT after {@code delayMs}; later connections are probes, answered
   * at once when {@code answerProbes}, never otherwise.
   */
  private static final class FakeNode implements AutoCloseable {
    final ServerSocket server;
    final AtomicInteger connections = new AtomicInteger();

    FakeNode(int delayMs, boolean answerProbes) throws IOException {
      server = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
      Thread t = new Thread(() -> {
        while (!server.isClosed()) {
          try {
            Socket s = server.accept();
            boolean probe = connections.getAndIncrement() > 0;
            Thread c = new Thread(() -> serve(s, probe ? 0 : delayMs, !probe || answerProbes));
            c.setDaemon(true);
            c.start();
          } catch (IOException e) {
            return;
          }
        }
      });
      t.setDaemon(true);
      t.start();
    }

    String addr() {
      return "127.0.0.1:" + server.getLocalPort();
    }

    private static void serve(Socket s, int delayMs, boolean answer) {
      try (s) {
        InputStream in = s.getInputStream();
        OutputStream out = s.getOutputStream();
        while (true) {
          List<String> cmd = readCommand(in);
          if (cmd == null) {
            return;
          }
          if (!answer) {
            continue;
          }
          if (cmd.get(0).equalsIgnoreCase("CLIENT")) {
            out.write("+OK\r\n".getBytes(StandardCharsets.US_ASCII));
          } else {
            Thread.sleep(delayMs);
            out.write("+PONG\r\n".getBytes(StandardCharsets.US_ASCII));
          }
          out.flush();
        }
      } catch (IOException | InterruptedException e) {
        // The client went away.
      }
    }

    /** One RESP array of bulk strings, or null at the end of the stream. */
    private static List<String> readCommand(InputStream in) throws IOException {
      String head = readLine(in);
      if (head == null) {
        return null;
      }
      int n = Integer.parseInt(head.substring(1));
      List<String> args = new java.util.ArrayList<>();
      for (int i = 0; i < n; i++) {
        int len = Integer.parseInt(readLine(in).substring(1));
        byte[] b = in.readNBytes(len + 2);
        args.add(new String(b, 0, len, StandardCharsets.UTF_8));
      }
      return args;
    }

    private static String readLine(InputStream in) throws IOException {
      ByteArrayOutputStream line = new ByteArrayOutputStream();
      int c;
      while ((c = in.read()) != '\n') {
        if (c < 0) {
          return null;
        }
        if (c != '\r') {
          line.write(c);
        }
      }
      return line.toString(StandardCharsets.US_ASCII);
    }

    @Override
    public void close() throws IOException {
      server.close();
    }
  }

  private static long millisSince(long startNanos) {
    return (System.nanoTime() - startNanos) / 1_000_000;
  }

  @Test
  void aBusyNodeThatAnswersProbesIsWaitedFor() throws Exception {
    try (FakeNode node = new FakeNode(1500, true);
        ClusterClient c = new ClusterClient(List.of(node.addr()), 1, 0, 0, 300, 10_000, null)) {
      long start = System.nanoTime();
      Object reply = c.callNode(0, "PING");
      long waited = millisSince(start);
      assertArrayEquals("PONG".getBytes(StandardCharsets.US_ASCII), (byte[]) reply);
      assertTrue(waited >= 1400, "answered after " + waited + " ms");
      assertTrue(node.connections.get() >= 3, "probes sent: " + (node.connections.get() - 1));
    }
  }

  @Test
  void aNodeThatAnswersNoProbeIsGivenUpAtTheCallTimeout() throws Exception {
    try (FakeNode node = new FakeNode(5000, false);
        ClusterClient c = new ClusterClient(List.of(node.addr()), 1, 0, 0, 300, 10_000, null)) {
      long start = System.nanoTime();
      assertThrows(ClusterClient.NodeDown.class, () -> c.callNode(0, "PING"));
      long waited = millisSince(start);
      // The call timeout, then one probe of at most timeout / 2.
      assertTrue(waited >= 280 && waited < 1500, "gave up after " + waited + " ms");
    }
  }

  @Test
  void aBusyNodeIsGivenUpAtTheBusyTimeout() throws Exception {
    try (FakeNode node = new FakeNode(5000, true);
        ClusterClient c = new ClusterClient(List.of(node.addr()), 1, 0, 0, 300, 1000, null)) {
      long start = System.nanoTime();
      assertThrows(ClusterClient.NodeDown.class, () -> c.callNode(0, "PING"));
      long waited = millisSince(start);
      assertTrue(waited >= 900 && waited < 2500, "gave up after " + waited + " ms");
    }
  }
}
