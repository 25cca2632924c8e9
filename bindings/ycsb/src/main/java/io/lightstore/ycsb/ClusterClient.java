package io.lightstore.ycsb;

import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.Connection;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisClientConfig;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;

/**
 * A LightStore cluster as the Rust cluster client sees it (crates/client):
 * the same ring, replicas on distinct nodes, versioned writes with VSET/VDEL
 * that succeed when the write quorum acknowledges (default: every replica
 * that is up, at least one), reads from every replica that is up (or the
 * read quorum) in parallel with the newest copy winning and stale replicas
 * repaired, failover, and range reads merged across all nodes. One instance per YCSB
 * thread: its connections are not shared.
 */
public final class ClusterClient implements AutoCloseable {
  /** A node did not answer or the connection broke. */
  static final class NodeDown extends Exception {
    private static final long serialVersionUID = 1L;

    NodeDown(String node, Throwable cause) {
      super("node " + node + ": " + cause.getMessage(), cause);
    }
  }

  /** A request the cluster could not serve. */
  public static final class ClusterException extends Exception {
    private static final long serialVersionUID = 1L;

    ClusterException(String msg) {
      super(msg);
    }
  }

  /** A connection whose requests can be sent now and answered later. */
  private static final class SplitConnection extends Connection {
    private final PatientSockets sockets;

    SplitConnection(PatientSockets sockets, JedisClientConfig cfg) {
      super(sockets, cfg);
      this.sockets = sockets;
    }

    @Override
    public void sendCommand(CommandArguments args) {
      // Null while Jedis's constructor sends its own setup commands.
      if (sockets != null) {
        sockets.callStarted();
      }
      super.sendCommand(args);
    }

    /** Writes one request to the socket without reading its reply. */
    void send(ProtocolCommand cmd, byte[]... args) {
      sendCommand(cmd, args);
      flush();
    }
  }

  private enum Cmd implements ProtocolCommand {
    VSET, VDEL, MGET, VMETA, RANGE, PING, HINT;

    private final byte[] raw = name().getBytes(StandardCharsets.US_ASCII);

    @Override
    public byte[] getRaw() {
      return raw;
    }
  }

  private static final ExecutorService FANOUT = Executors.newCachedThreadPool(r -> {
    Thread t = new Thread(r, "lightstore-fanout");
    t.setDaemon(true);
    return t;
  });
  private static final AtomicLong CLOCK = new AtomicLong();
  private static final int MAX_PAGE = 1000;
  /** Default busy timeout: the engine's longest write stall, as in the Rust client. */
  static final int DEFAULT_BUSY_TIMEOUT_MS = 30_000;

  private final List<String> nodes;
  private final Ring ring;
  private final int replicas;
  private final int writeQuorum;
  private final int readQuorum;
  private final int timeoutMs;
  private final int busyTimeoutMs;
  private final long retryMs;
  private final String password;
  private final Jedis[] conns;
  private final SplitConnection[] raw;
  private final long[] downUntil;
  private long readRepairs;

  /**
   * A client of these nodes ("host:port"); {@code replicas} 0 means the default
   * (2 with at least 2 nodes), {@code writeQuorum} and {@code readQuorum} 0 mean
   * every replica that is up.
   */
  public ClusterClient(List<String> nodes, int replicas, int writeQuorum, int readQuorum,
      int timeoutMs, String password) {
    this(nodes, replicas, writeQuorum, readQuorum, timeoutMs, DEFAULT_BUSY_TIMEOUT_MS, password);
  }

  /**
   * As above, with the longest a call waits on a node that is slow but
   * answers probes ({@code busyTimeoutMs}; at most {@code timeoutMs}: a call
   * fails at {@code timeoutMs} whatever the node does). See {@link PatientSockets}.
   */
  public ClusterClient(List<String> nodes, int replicas, int writeQuorum, int readQuorum,
      int timeoutMs, int busyTimeoutMs, String password) {
    if (nodes.isEmpty()) {
      throw new IllegalArgumentException("the cluster has no nodes");
    }
    this.nodes = List.copyOf(nodes);
    this.ring = new Ring(this.nodes);
    int r = replicas > 0 ? replicas : (nodes.size() >= 2 ? 2 : 1);
    this.replicas = Math.min(r, nodes.size());
    this.writeQuorum = writeQuorum;
    this.readQuorum = readQuorum;
    this.timeoutMs = timeoutMs;
    this.busyTimeoutMs = busyTimeoutMs;
    this.retryMs = 500;
    this.password = password;
    this.conns = new Jedis[nodes.size()];
    this.raw = new SplitConnection[nodes.size()];
    this.downUntil = new long[nodes.size()];
  }

  /** This JVM's client id, in the low bits of its versions (random, 12 bits). */
  private static final int CLIENT_ID =
      new java.security.SecureRandom().nextInt(Versioned.MAX_CLIENT_ID + 1);

  /**
   * A new write version: microseconds since the epoch with this JVM's client id
   * in the low 12 bits, increasing in this JVM (Versioned.nextVersion).
   */
  static long nextVersion() {
    java.time.Instant t = java.time.Instant.now();
    long now = t.getEpochSecond() * 1_000_000L + t.getNano() / 1_000;
    return CLOCK.updateAndGet(last -> Versioned.nextVersion(last, now, CLIENT_ID));
  }

  /** Replicas of a key, primary first. */
  public int[] replicasOf(byte[] key) {
    return ring.replicas(key, replicas);
  }

  private boolean isUp(int node) {
    return System.currentTimeMillis() >= downUntil[node];
  }

  private Jedis conn(int node) {
    if (conns[node] == null) {
      String addr = nodes.get(node);
      int colon = addr.lastIndexOf(':');
      HostAndPort hp = new HostAndPort(addr.substring(0, colon),
          Integer.parseInt(addr.substring(colon + 1)));
      DefaultJedisClientConfig.Builder cfg = DefaultJedisClientConfig.builder()
          .connectionTimeoutMillis(timeoutMs).socketTimeoutMillis(timeoutMs);
      if (password != null) {
        cfg.password(password);
      }
      raw[node] = new SplitConnection(new PatientSockets(hp, timeoutMs, busyTimeoutMs),
          cfg.build());
      conns[node] = new Jedis(raw[node]);
    }
    return conns[node];
  }

  /** Marks a node down after its connection broke; the exception to report. */
  private NodeDown down(int node, JedisConnectionException e) {
    closeConn(node);
    downUntil[node] = System.currentTimeMillis() + retryMs;
    return new NodeDown(nodes.get(node), e);
  }

  private Object call(int node, Cmd cmd, byte[]... args) throws NodeDown {
    try {
      Object reply = conn(node).sendCommand(cmd, args);
      downUntil[node] = 0;
      return reply;
    } catch (JedisConnectionException e) {
      throw down(node, e);
    }
  }

  /** Sends any command to node {@code node} (for tests). */
  Object callNode(int node, String command, byte[]... args) throws NodeDown {
    ProtocolCommand cmd = () -> command.getBytes(StandardCharsets.US_ASCII);
    try {
      return conn(node).sendCommand(cmd, args);
    } catch (JedisConnectionException e) {
      closeConn(node);
      throw new NodeDown(nodes.get(node), e);
    }
  }

  private void closeConn(int node) {
    Jedis j = conns[node];
    conns[node] = null;
    raw[node] = null;
    if (j != null) {
      try {
        j.close();
      } catch (RuntimeException ignored) {
        // The connection is already broken.
      }
    }
  }

  /**
   * Writes keys that share one placement (one record's fields): {@code values[i]}
   * null deletes {@code keys[i]}. One VSET (and one VDEL) per replica, sent to
   * every replica before any reply is read, so the replicas work in parallel.
   */
  public void write(List<byte[]> keys, List<byte[]> values) throws ClusterException {
    if (keys.isEmpty()) {
      return;
    }
    byte[] version = Long.toUnsignedString(nextVersion()).getBytes(StandardCharsets.US_ASCII);
    List<byte[]> vset = new ArrayList<>();
    List<byte[]> vdel = new ArrayList<>();
    for (int i = 0; i < keys.size(); i++) {
      if (values.get(i) == null) {
        vdel.add(keys.get(i));
        vdel.add(version);
      } else {
        vset.add(keys.get(i));
        vset.add(version);
        vset.add(values.get(i));
      }
    }
    int[] all = replicasOf(keys.get(0));
    int[] targets = Arrays.stream(all).filter(this::isUp).toArray();
    if (targets.length == 0) {
      targets = all;
    }
    List<String> outcomes = writeAll(targets, vset, vdel);
    int acked = 0;
    String refused = null;
    String last = null;
    List<Integer> ackedBy = new ArrayList<>();
    List<Integer> missedBy = new ArrayList<>();
    for (int node : all) {
      if (Arrays.stream(targets).noneMatch(t -> t == node)) {
        missedBy.add(node);
      }
    }
    for (int t = 0; t < outcomes.size(); t++) {
      String o = outcomes.get(t);
      if (o == null) {
        acked++;
        ackedBy.add(targets[t]);
      } else {
        missedBy.add(targets[t]);
        if (o.startsWith("refused: ")) {
          refused = o;
        } else {
          last = o;
        }
      }
    }
    recordHints(keys, version, ackedBy, missedBy);
    int needed = writeQuorum > 0 ? Math.min(writeQuorum, all.length) : 1;
    if (acked < needed || (writeQuorum == 0 && refused != null)) {
      throw new ClusterException("write reached " + acked + " replicas, needs " + needed + ": "
          + (refused != null ? refused : last));
    }
  }

  /**
   * Tells the replicas that took a write which replicas missed it ({@code HINT
   * missed key version ...}), as the Rust client's kv.rs does, so they hand it
   * off when the missed node answers again. Best effort.
   */
  private void recordHints(List<byte[]> keys, byte[] version, List<Integer> ackedBy,
      List<Integer> missedBy) {
    if (ackedBy.isEmpty() || missedBy.isEmpty()) {
      return;
    }
    for (int holder : ackedBy) {
      for (int missed : missedBy) {
        List<byte[]> args = new ArrayList<>();
        args.add(nodes.get(missed).getBytes(StandardCharsets.US_ASCII));
        for (byte[] k : keys) {
          args.add(k);
          args.add(version);
        }
        try {
          call(holder, Cmd.HINT, args.toArray(new byte[0][]));
        } catch (NodeDown | JedisDataException e) {
          // Consistent reads and repair still catch the missed node up.
        }
      }
    }
  }

  /**
   * Sends every target its VSET/VDEL before reading any reply (as the Rust
   * client's pipeline_all). Per target: null when it took the write, else why
   * not ("refused: ..." for error replies), as {@link #writeOne}.
   */
  private List<String> writeAll(int[] targets, List<byte[]> vset, List<byte[]> vdel) {
    String[] outcome = new String[targets.length];
    boolean[] sent = new boolean[targets.length];
    int replies = (vset.isEmpty() ? 0 : 1) + (vdel.isEmpty() ? 0 : 1);
    for (int t = 0; t < targets.length; t++) {
      int node = targets[t];
      try {
        conn(node);
        if (!vset.isEmpty()) {
          raw[node].send(Cmd.VSET, vset.toArray(new byte[0][]));
        }
        if (!vdel.isEmpty()) {
          raw[node].send(Cmd.VDEL, vdel.toArray(new byte[0][]));
        }
        sent[t] = true;
      } catch (JedisConnectionException e) {
        outcome[t] = down(node, e).getMessage();
      }
    }
    for (int t = 0; t < targets.length; t++) {
      if (!sent[t]) {
        continue;
      }
      int node = targets[t];
      try {
        String refused = null;
        for (int i = 0; i < replies; i++) {
          try {
            raw[node].getOne();
          } catch (JedisDataException e) {
            // The error reply was read whole: the next reply follows.
            if (refused == null) {
              refused = "refused: node " + nodes.get(node) + ": " + e.getMessage();
            }
          }
        }
        downUntil[node] = 0;
        outcome[t] = refused;
      } catch (JedisConnectionException e) {
        outcome[t] = down(node, e).getMessage();
      }
    }
    return Arrays.asList(outcome);
  }

  /** null when the node took the write, else why not ("refused: ..." for error replies). */
  private String writeOne(int node, List<byte[]> vset, List<byte[]> vdel) {
    try {
      if (!vset.isEmpty()) {
        call(node, Cmd.VSET, vset.toArray(new byte[0][]));
      }
      if (!vdel.isEmpty()) {
        call(node, Cmd.VDEL, vdel.toArray(new byte[0][]));
      }
      return null;
    } catch (NodeDown e) {
      return e.getMessage();
    } catch (JedisDataException e) {
      return "refused: node " + nodes.get(node) + ": " + e.getMessage();
    }
  }

  /**
   * Reads keys: one MGET per node, nodes in parallel, each key from every
   * replica that is up (or the first {@code readQuorum}), failing over to the
   * next. The newest copy wins; replicas found older are given it (read repair).
   * Missing and deleted keys read as null.
   */
  public List<byte[]> mget(List<byte[]> keys) throws ClusterException {
    List<byte[]> out = new ArrayList<>(keys.size());
    for (byte[] stored : readStored(keys)) {
      out.add(stored == null ? null : Versioned.decode(stored).value);
    }
    return out;
  }

  /** Copies written back by read repair. */
  public long readRepairs() {
    return readRepairs;
  }

  /** The replicas of a key, those up first (primary first). */
  private int[] readOrder(byte[] key) {
    Integer[] order = Arrays.stream(replicasOf(key)).boxed().toArray(Integer[]::new);
    Arrays.sort(order, (a, b) -> Boolean.compare(!isUp(a), !isUp(b)));
    return Arrays.stream(order).mapToInt(Integer::intValue).toArray();
  }

  /** Replicas a read asks at first: the read quorum, or every replica that is up (at least 1). */
  private int readWidth(int[] order) {
    if (readQuorum > 0) {
      return Math.min(readQuorum, order.length);
    }
    return Math.max(1, (int) Arrays.stream(order).filter(this::isUp).count());
  }

  private List<byte[]> mgetOn(int node, List<byte[]> keys) throws NodeDown {
    Object reply = call(node, Cmd.MGET, keys.toArray(new byte[0][]));
    List<byte[]> out = new ArrayList<>(keys.size());
    for (Object o : (List<?>) reply) {
      out.add(o instanceof byte[] b ? b : null);
    }
    return out;
  }

  /** A node's digest of its copy of a key (VMETA, RANGE ... DIGESTS). */
  record Digest(long version, long crc, boolean deleted) {
    /** Parses {@code [version, crc32c, length, deleted]}; null for Null (no copy). */
    static Digest parse(Object reply) {
      if (!(reply instanceof List<?> f)) {
        return null;
      }
      long version = Long.parseUnsignedLong(new String((byte[]) f.get(0), StandardCharsets.US_ASCII));
      return new Digest(version, (Long) f.get(1), (Long) f.get(3) != 0);
    }
  }

  /** One node's pages of a range: keys with their digests. */
  private static final class Cursor {
    final int node;
    byte[] next;
    final ArrayDeque<Object[]> buf = new ArrayDeque<>();
    boolean done;

    Cursor(int node, byte[] start) {
      this.node = node;
      this.next = start;
    }
  }

  /** A listed key: the nodes that listed it, with their digests (null: vanished). */
  private static final class Listed {
    final byte[] key;
    final List<Integer> nodes = new ArrayList<>(2);
    final List<Digest> digests = new ArrayList<>(2);

    Listed(byte[] key) {
      this.key = key;
    }

    long newestVersion() {
      long v = 0;
      for (Digest d : digests) {
        if (d != null && Long.compareUnsigned(d.version(), v) > 0) {
          v = d.version();
        }
      }
      return v;
    }

    /** The newest copy listed is a tombstone, or no node still holds the key. */
    boolean isDeleted() {
      long v = newestVersion();
      for (Digest d : digests) {
        if (d != null && d.version() == v && !d.deleted()) {
          return false;
        }
      }
      return true;
    }

    /** One node per distinct copy at the newest version, in listing order. */
    List<Integer> sources() {
      long v = newestVersion();
      List<Long> crcs = new ArrayList<>(2);
      List<Integer> out = new ArrayList<>(2);
      for (int i = 0; i < digests.size(); i++) {
        Digest d = digests.get(i);
        if (d != null && d.version() == v && !crcs.contains(d.crc())) {
          crcs.add(d.crc());
          out.add(nodes.get(i));
        }
      }
      return out;
    }
  }

  /**
   * Up to {@code limit} pairs with start <= key < end (empty end: unbounded), in
   * key order over the whole cluster, as the Rust client's range.rs does it:
   * digests are listed on every node that is up ({@code RANGE ... DIGESTS}: the
   * version and checksum of each copy, no value read) and merged; each live
   * key's newest copy is then read once, from a node that holds it, and the
   * replicas the listing showed older or lacking the key are given it (read
   * repair); deletions are dropped.
   */
  public List<byte[][]> range(byte[] start, byte[] end, int limit) throws ClusterException {
    List<Cursor> cursors = new ArrayList<>();
    for (int i = 0; i < nodes.size(); i++) {
      if (isUp(i)) {
        cursors.add(new Cursor(i, start));
      }
    }
    int[] down = {nodes.size() - cursors.size()};
    int page = Math.max(1, Math.min(MAX_PAGE, limit * replicas / Math.max(1, cursors.size()) + limit / 4 + 8));
    byte[] pageText = Integer.toString(page).getBytes(StandardCharsets.US_ASCII);
    List<byte[][]> out = new ArrayList<>();
    boolean exhausted = false;
    while (out.size() < limit && !exhausted) {
      int want = limit - out.size();
      List<Listed> live = new ArrayList<>();
      java.util.Map<Integer, List<byte[][]>> repairs = new java.util.TreeMap<>();
      while (live.size() < want) {
        refill(cursors, end, page, pageText, down);
        byte[] min = null;
        for (Cursor cur : cursors) {
          if (!cur.buf.isEmpty()) {
            byte[] k = (byte[]) cur.buf.peekFirst()[0];
            if (min == null || Arrays.compareUnsigned(k, min) < 0) {
              min = k;
            }
          }
        }
        if (min == null) {
          exhausted = true;
          break;
        }
        Listed k = new Listed(min);
        for (Cursor cur : cursors) {
          if (!cur.buf.isEmpty() && Arrays.equals((byte[]) cur.buf.peekFirst()[0], min)) {
            k.nodes.add(cur.node);
            k.digests.add((Digest) cur.buf.pollFirst()[1]);
          }
        }
        if (k.isDeleted()) {
          long v = k.newestVersion();
          if (v != 0) {
            noteBehind(k, Versioned.encodeTombstone(v), cursors, repairs);
          }
        } else {
          live.add(k);
        }
      }
      List<byte[]> copies = readNewest(live);
      for (int i = 0; i < live.size(); i++) {
        byte[] best = copies.get(i);
        if (best == null) {
          continue;
        }
        noteBehind(live.get(i), best, cursors, repairs);
        byte[] value = Versioned.decode(best).value;
        if (value != null) {
          out.add(new byte[][] {live.get(i).key, value});
        }
      }
      if (!repairs.isEmpty()) {
        readRepair(repairs);
      }
    }
    return out;
  }

  /**
   * The newest copy of each listed key: one MGET per source node, pipelined to
   * all nodes at once. A key whose sources failed or no longer have it is read
   * from every node that listed it; fails if that gives a copy older than
   * listed, or nothing while a source failed.
   */
  private List<byte[]> readNewest(List<Listed> live) throws ClusterException {
    List<byte[]> keys = new ArrayList<>(live.size());
    java.util.Map<Integer, Ask> asks = new java.util.TreeMap<>();
    for (int i = 0; i < live.size(); i++) {
      keys.add(live.get(i).key);
      for (int node : live.get(i).sources()) {
        asks.computeIfAbsent(node, x -> new Ask()).copies.add(i);
      }
    }
    List<byte[]> best = new ArrayList<>(java.util.Collections.nCopies(live.size(), (byte[]) null));
    boolean[] failed = new boolean[live.size()];
    for (java.util.Map.Entry<Integer, Object> r : askAll(keys, asks).entrySet()) {
      if (r.getValue() instanceof List<?> got) {
        for (Object o : got) {
          Answer a = (Answer) o;
          byte[] b = best.get(a.node());
          if (a.copy() != null && (b == null || Versioned.compareStored(a.copy(), b) > 0)) {
            best.set(a.node(), a.copy());
          }
        }
      } else if (r.getValue() instanceof NodeDown) {
        for (int i : asks.get(r.getKey()).copies) {
          failed[i] = true;
        }
      } else {
        throw new ClusterException("node " + nodes.get(r.getKey()) + ": " + r.getValue());
      }
    }
    for (int i = 0; i < live.size(); i++) {
      Listed k = live.get(i);
      if (failed[i] || best.get(i) == null || isOlder(best.get(i), k.newestVersion())) {
        best.set(i, newestFrom(k.key, k.nodes));
        // Gone from every node that answered is a deletion since the listing;
        // gone because its source failed, or older than listed, would be stale.
        if (isOlder(best.get(i), k.newestVersion()) || (best.get(i) == null && failed[i])) {
          throw new ClusterException("no replica of a key that listed its newest copy could send it");
        }
      }
    }
    return best;
  }

  private static boolean isOlder(byte[] copy, long listedVersion) {
    return copy != null && Long.compareUnsigned(Versioned.decode(copy).version, listedVersion) < 0;
  }

  /**
   * Adds to {@code repairs} every replica of the key still in the merge whose
   * listing showed it older than {@code best}, or without the key while
   * {@code best} is a value.
   */
  private void noteBehind(Listed k, byte[] best, List<Cursor> merged,
      java.util.Map<Integer, List<byte[][]>> repairs) {
    Versioned decoded = Versioned.decode(best);
    long version = decoded.version;
    long crc = crc32c(best);
    boolean isValue = decoded.value != null;
    for (int r : replicasOf(k.key)) {
      if (!inMerge(merged, r)) {
        continue;
      }
      int at = k.nodes.indexOf(r);
      Digest d = at < 0 ? null : k.digests.get(at);
      boolean behind = d == null ? isValue
          : Long.compareUnsigned(d.version(), version) < 0 || (d.version() == version && d.crc() != crc);
      if (behind) {
        repairs.computeIfAbsent(r, x -> new ArrayList<>()).add(new byte[][] {k.key, best});
      }
    }
  }

  private static boolean inMerge(List<Cursor> merged, int node) {
    for (Cursor c : merged) {
      if (c.node == node) {
        return true;
      }
    }
    return false;
  }

  /**
   * Fetches the next page of every cursor that ran dry: each node's RANGE is
   * sent before any reply is read, so the nodes work in parallel without a
   * thread per node.
   */
  private void refill(List<Cursor> cursors, byte[] end, int page, byte[] pageText, int[] down)
      throws ClusterException {
    List<Cursor> dry = new ArrayList<>();
    for (Cursor cur : cursors) {
      if (cur.buf.isEmpty() && !cur.done) {
        dry.add(cur);
      }
    }
    if (dry.isEmpty()) {
      return;
    }
    Object[] results = new Object[dry.size()];
    byte[] limit = "LIMIT".getBytes(StandardCharsets.US_ASCII);
    byte[] digests = "DIGESTS".getBytes(StandardCharsets.US_ASCII);
    for (int i = 0; i < dry.size(); i++) {
      Cursor cur = dry.get(i);
      try {
        conn(cur.node);
        raw[cur.node].send(Cmd.RANGE, cur.next, end, limit, pageText, digests);
      } catch (JedisConnectionException e) {
        results[i] = down(cur.node, e);
      }
    }
    for (int i = 0; i < dry.size(); i++) {
      if (results[i] != null) {
        continue;
      }
      int node = dry.get(i).node;
      try {
        results[i] = raw[node].getOne();
        downUntil[node] = 0;
      } catch (JedisConnectionException e) {
        results[i] = down(node, e);
      } catch (RuntimeException e) {
        closeConn(node);
        results[i] = e;
      }
    }
    for (int i = 0; i < dry.size(); i++) {
      Cursor cur = dry.get(i);
      Object r = results[i];
      if (r instanceof NodeDown) {
        cursors.remove(cur);
        down[0]++;
      } else if (r instanceof Throwable t) {
        throw new ClusterException("node " + nodes.get(cur.node) + ": " + t.getMessage());
      } else {
        List<?> items = (List<?>) r;
        try {
          for (int j = 0; j + 1 < items.size(); j += 2) {
            cur.buf.add(new Object[] {(byte[]) items.get(j), Digest.parse(items.get(j + 1))});
          }
        } catch (RuntimeException e) {
          throw new ClusterException("node " + nodes.get(cur.node) + ": unexpected RANGE reply: " + e);
        }
        cur.done = items.size() / 2 < page;
        if (!cur.buf.isEmpty()) {
          byte[] lastKey = (byte[]) cur.buf.peekLast()[0];
          cur.next = Arrays.copyOf(lastKey, lastKey.length + 1);
        }
      }
    }
    if (down[0] >= replicas) {
      throw new ClusterException(down[0] + " nodes are down; some keys may have no copy");
    }
  }

  /** Runs {@code f} on every item, all but the first on the fan-out pool. */
  private <T> List<Object> parallel(List<T> items, java.util.function.Function<T, Object> f)
      throws ClusterException {
    List<Future<Object>> futures = new ArrayList<>();
    for (int i = 1; i < items.size(); i++) {
      T item = items.get(i);
      futures.add(FANOUT.submit(() -> f.apply(item)));
    }
    List<Object> results = new ArrayList<>();
    if (!items.isEmpty()) {
      results.add(f.apply(items.get(0)));
    }
    for (Future<Object> fut : futures) {
      try {
        results.add(fut.get());
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new ClusterException("interrupted");
      } catch (ExecutionException e) {
        results.add(e.getCause());
      }
    }
    return results;
  }

  /** What one replica answered for a key: its copy, or its copy's digest. */
  private record Answer(int node, boolean isCopy, byte[] copy, boolean has, long version,
      long crc) {
    static Answer copy(int node, byte[] copy) {
      return new Answer(node, true, copy, copy != null, 0, 0);
    }
  }

  /** Keys asked of one node: copies (MGET) and digests (VMETA). */
  private static final class Ask {
    final List<Integer> copies = new ArrayList<>();
    final List<Integer> digests = new ArrayList<>();
  }

  /**
   * The newest stored copy (tombstones included) of each key over its read
   * replicas, as the Rust client's read.rs does it: the first replica in read
   * order sends the copy (MGET), the others only its digest (VMETA: version,
   * CRC32C), nodes in parallel; a failed node's keys are asked of the next
   * replica; a digest newer than the copy, or different at the same version,
   * is fetched; then every replica found behind is given the newest copy.
   */
  private List<byte[]> readStored(List<byte[]> keys) throws ClusterException {
    int n = keys.size();
    int[][] orders = new int[n][];
    int[] next = new int[n];
    int[] wanted = new int[n];
    boolean[] hasCopy = new boolean[n];
    List<List<Answer>> answers = new ArrayList<>(n);
    List<Integer> pending = new ArrayList<>(n);
    for (int k = 0; k < n; k++) {
      orders[k] = readOrder(keys.get(k));
      wanted[k] = readWidth(orders[k]);
      answers.add(new ArrayList<>(wanted[k]));
      pending.add(k);
    }
    String last = "no replica";
    while (!pending.isEmpty()) {
      java.util.Map<Integer, Ask> asks = new java.util.TreeMap<>();
      for (int k : pending) {
        boolean copyAsked = hasCopy[k];
        for (int asked = 0; (answers.get(k).size() + asked < wanted[k] || !copyAsked)
            && next[k] < orders[k].length; asked++) {
          Ask ask = asks.computeIfAbsent(orders[k][next[k]++], x -> new Ask());
          if (copyAsked) {
            ask.digests.add(k);
          } else {
            ask.copies.add(k);
            copyAsked = true;
          }
        }
      }
      if (asks.isEmpty()) {
        break;
      }
      pending.clear();
      for (java.util.Map.Entry<Integer, Object> r : askAll(keys, asks).entrySet()) {
        int node = r.getKey();
        Ask ask = asks.get(node);
        if (r.getValue() instanceof List<?> got) {
          for (Object o : got) {
            Answer a = (Answer) o;
            answers.get(a.node()).add(new Answer(node, a.isCopy(), a.copy(), a.has(), a.version(),
                a.crc()));
            hasCopy[a.node()] |= a.isCopy();
          }
        } else if (r.getValue() instanceof NodeDown d) {
          last = d.getMessage();
          pending.addAll(ask.copies);
          pending.addAll(ask.digests);
        } else {
          throw new ClusterException("node " + nodes.get(node) + ": " + r.getValue());
        }
      }
      pending.removeIf(k -> next[k] >= orders[k].length);
      pending = new ArrayList<>(new java.util.TreeSet<>(pending));
    }
    checkAnswered(answers, orders, last);
    fetchNewerCopies(keys, answers);
    checkAnswered(answers, orders, last);
    java.util.Map<Integer, List<byte[][]>> repairs = new java.util.TreeMap<>();
    List<byte[]> out = new ArrayList<>(n);
    for (int k = 0; k < n; k++) {
      byte[] best = newestCopy(answers.get(k));
      if (best != null) {
        for (Answer a : answers.get(k)) {
          if (isBehind(a, best)) {
            repairs.computeIfAbsent(a.node(), x -> new ArrayList<>())
                .add(new byte[][] {keys.get(k), best});
          }
        }
      }
      out.add(best);
    }
    if (!repairs.isEmpty()) {
      readRepair(repairs);
    }
    return out;
  }

  private void checkAnswered(List<List<Answer>> answers, int[][] orders, String last)
      throws ClusterException {
    int needed = Math.max(1, readQuorum);
    for (int k = 0; k < answers.size(); k++) {
      int got = answers.get(k).size();
      if (got == 0 || got < Math.min(needed, orders[k].length)) {
        throw new ClusterException(got + " of the " + orders[k].length
            + " replicas of a key answered, the read needs " + needed + ": " + last);
      }
    }
  }

  /** The newest copy among the answers that sent one. */
  private static byte[] newestCopy(List<Answer> answers) {
    byte[] best = null;
    for (Answer a : answers) {
      if (a.isCopy() && a.copy() != null
          && (best == null || Versioned.compareStored(a.copy(), best) > 0)) {
        best = a.copy();
      }
    }
    return best;
  }

  /** Whether a replica that answered {@code a} should be given {@code best}. */
  private static boolean isBehind(Answer a, byte[] best) {
    if (!a.has()) {
      return Versioned.decode(best).value != null;
    }
    if (a.isCopy()) {
      return Versioned.compareStored(a.copy(), best) < 0;
    }
    return Long.compareUnsigned(a.version(), Versioned.decode(best).version) < 0;
  }

  private static long crc32c(byte[] b) {
    java.util.zip.CRC32C c = new java.util.zip.CRC32C();
    c.update(b);
    return c.getValue();
  }

  /** Replaces digests newer than the newest copy (or different at its version) by copies. */
  private void fetchNewerCopies(List<byte[]> keys, List<List<Answer>> answers)
      throws ClusterException {
    java.util.Map<Integer, Ask> asks = new java.util.TreeMap<>();
    for (int k = 0; k < answers.size(); k++) {
      byte[] best = newestCopy(answers.get(k));
      long bestVersion = best == null ? 0 : Versioned.decode(best).version;
      for (Answer a : answers.get(k)) {
        if (a.isCopy() || !a.has()) {
          continue;
        }
        int cmp = Long.compareUnsigned(a.version(), bestVersion);
        if (best == null || cmp > 0 || (cmp == 0 && a.crc() != crc32c(best))) {
          asks.computeIfAbsent(a.node(), x -> new Ask()).copies.add(k);
        }
      }
    }
    if (asks.isEmpty()) {
      return;
    }
    for (java.util.Map.Entry<Integer, Object> r : askAll(keys, asks).entrySet()) {
      int node = r.getKey();
      if (r.getValue() instanceof List<?> got) {
        for (Object o : got) {
          Answer a = (Answer) o;
          List<Answer> list = answers.get(a.node());
          list.removeIf(x -> x.node() == node);
          list.add(Answer.copy(node, a.copy()));
        }
      } else if (r.getValue() instanceof NodeDown) {
        for (int k : asks.get(node).copies) {
          answers.get(k).removeIf(x -> x.node() == node);
        }
      } else {
        throw new ClusterException("node " + nodes.get(node) + ": " + r.getValue());
      }
    }
  }

  /**
   * Sends every node its asks (MGET, then VMETA, on one connection) before
   * reading any reply, so the nodes work in parallel without a thread per
   * node. Per node: a list of answers whose {@code node} field holds the key
   * index, a {@link NodeDown}, or the exception the reply raised.
   */
  private java.util.Map<Integer, Object> askAll(List<byte[]> keys, java.util.Map<Integer, Ask> asks) {
    java.util.Map<Integer, Object> results = new java.util.TreeMap<>();
    for (java.util.Map.Entry<Integer, Ask> e : asks.entrySet()) {
      int node = e.getKey();
      try {
        conn(node);
        if (!e.getValue().copies.isEmpty()) {
          raw[node].send(Cmd.MGET, select(keys, e.getValue().copies));
        }
        if (!e.getValue().digests.isEmpty()) {
          raw[node].send(Cmd.VMETA, select(keys, e.getValue().digests));
        }
      } catch (JedisConnectionException ex) {
        results.put(node, down(node, ex));
      }
    }
    for (java.util.Map.Entry<Integer, Ask> e : asks.entrySet()) {
      int node = e.getKey();
      if (results.containsKey(node)) {
        continue;
      }
      Ask ask = e.getValue();
      try {
        List<Answer> got = new ArrayList<>();
        if (!ask.copies.isEmpty()) {
          List<?> vals = (List<?>) raw[node].getOne();
          for (int i = 0; i < ask.copies.size(); i++) {
            got.add(Answer.copy(ask.copies.get(i), vals.get(i) instanceof byte[] b ? b : null));
          }
        }
        if (!ask.digests.isEmpty()) {
          List<?> metas = (List<?>) raw[node].getOne();
          for (int i = 0; i < ask.digests.size(); i++) {
            int k = ask.digests.get(i);
            Digest d = Digest.parse(metas.get(i));
            got.add(d == null ? new Answer(k, false, null, false, 0, 0)
                : new Answer(k, false, null, true, d.version(), d.crc()));
          }
        }
        downUntil[node] = 0;
        results.put(node, got);
      } catch (JedisConnectionException ex) {
        results.put(node, down(node, ex));
      } catch (RuntimeException ex) {
        // An error reply leaves the rest of the pipeline unread: start over.
        closeConn(node);
        results.put(node, ex);
      }
    }
    return results;
  }

  private static byte[][] select(List<byte[]> keys, List<Integer> idx) {
    byte[][] out = new byte[idx.size()][];
    for (int i = 0; i < idx.size(); i++) {
      out[i] = keys.get(idx.get(i));
    }
    return out;
  }

  /** Writes the newest copies back to the replicas found stale, nodes in parallel; best effort. */
  private void readRepair(java.util.Map<Integer, List<byte[][]>> repairs)
      throws ClusterException {
    List<java.util.Map.Entry<Integer, List<byte[][]>>> jobs = new ArrayList<>(repairs.entrySet());
    List<Object> results = parallel(jobs, job -> {
      List<byte[]> vset = new ArrayList<>();
      List<byte[]> vdel = new ArrayList<>();
      for (byte[][] copy : job.getValue()) {
        Versioned v = Versioned.decode(copy[1]);
        byte[] version = Long.toUnsignedString(v.version).getBytes(StandardCharsets.US_ASCII);
        if (v.value == null) {
          vdel.add(copy[0]);
          vdel.add(version);
        } else {
          vset.add(copy[0]);
          vset.add(version);
          vset.add(v.value);
        }
      }
      String failed = writeOne(job.getKey(), vset, vdel);
      return failed == null ? (Object) job.getValue().size() : failed;
    });
    for (Object r : results) {
      if (r instanceof Integer count) {
        readRepairs += count;
      }
    }
  }

  /** The newest stored copy of a key among the nodes that listed it. */
  private byte[] newestFrom(byte[] key, List<Integer> holders) throws ClusterException {
    byte[] best = null;
    for (int n : holders) {
      try {
        List<byte[]> v = mgetOn(n, List.of(key));
        byte[] s = v.get(0);
        if (s != null && (best == null || Versioned.compareStored(s, best) > 0)) {
          best = s;
        }
      } catch (NodeDown e) {
        // Another holder may answer.
      } catch (JedisDataException e) {
        throw new ClusterException("node " + nodes.get(n) + ": " + e.getMessage());
      }
    }
    return best;
  }

  @Override
  public void close() {
    for (int i = 0; i < conns.length; i++) {
      closeConn(i);
    }
  }
}
