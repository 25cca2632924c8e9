package io.lightstore.ycsb;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.Vector;
import org.junit.jupiter.api.Test;
import site.ycsb.ByteIterator;
import site.ycsb.Status;
import site.ycsb.StringByteIterator;

/**
 * The binding's five operations against a running cluster. Runs only when
 * {@code -Dlightstore.nodes=host:port,...} is given (bench/ycsb does, with
 * CHECK=1); skipped otherwise.
 */
class LiveClusterTest {
  private static LightStoreClient open(String nodes) throws Exception {
    Properties p = new Properties();
    p.setProperty("lightstore.nodes", nodes);
    p.setProperty("fieldcount", "3");
    LightStoreClient db = new LightStoreClient();
    db.setProperties(p);
    db.init();
    return db;
  }

  private static Map<String, ByteIterator> record(String tag) {
    Map<String, String> m = new HashMap<>();
    for (int f = 0; f < 3; f++) {
      m.put("field" + f, tag + "-" + f);
    }
    return StringByteIterator.getByteIteratorMap(m);
  }

  private static Map<String, String> strings(Map<String, ByteIterator> m) {
    Map<String, String> out = new HashMap<>();
    m.forEach((k, v) -> out.put(k, v.toString()));
    return out;
  }

  @Test
  void insertReadUpdateScanDelete() throws Exception {
    String nodes = System.getProperty("lightstore.nodes");
    assumeTrue(nodes != null && !nodes.isBlank(), "no -Dlightstore.nodes");
    LightStoreClient db = open(nodes);
    String table = "livetest" + System.nanoTime();
    for (int i = 0; i < 50; i++) {
      assertEquals(Status.OK, db.insert(table, String.format("k%03d", i), record("v" + i)));
    }
    Map<String, ByteIterator> got = new HashMap<>();
    assertEquals(Status.OK, db.read(table, "k007", null, got));
    assertEquals(Map.of("field0", "v7-0", "field1", "v7-1", "field2", "v7-2"), strings(got));

    Map<String, String> upd = Map.of("field1", "changed");
    assertEquals(Status.OK, db.update(table, "k007", StringByteIterator.getByteIteratorMap(upd)));
    got.clear();
    assertEquals(Status.OK, db.read(table, "k007", Set.of("field1", "field2"), got));
    assertEquals(Map.of("field1", "changed", "field2", "v7-2"), strings(got));

    assertEquals(Status.OK, db.delete(table, "k010"));
    got.clear();
    assertEquals(Status.NOT_FOUND, db.read(table, "k010", null, got));

    Vector<HashMap<String, ByteIterator>> rows = new Vector<>();
    assertEquals(Status.OK, db.scan(table, "k005", 8, null, rows));
    assertEquals(8, rows.size());
    List<String> firsts = rows.stream().map(r -> r.get("field0").toString()).toList();
    // k005..k013 without the deleted k010, in key order.
    assertEquals(List.of("v5-0", "v6-0", "v7-0", "v8-0", "v9-0", "v11-0", "v12-0", "v13-0"), firsts);
    assertEquals("changed", rows.get(2).get("field1").toString());

    rows.clear();
    assertEquals(Status.OK, db.scan(table, "k045", 100, Set.of("field2"), rows));
    assertEquals(5, rows.size(), "the scan stops at the table's last record");
    Set<String> fields = new TreeSet<>();
    rows.forEach(r -> fields.addAll(r.keySet()));
    assertEquals(Set.of("field2"), fields);
    assertTrue(rows.get(4).get("field2").toString().startsWith("v49"));
    db.cleanup();
  }

  /**
   * The consistent-read rule of the Rust client (crates/client/src/read.rs):
   * one replica holds a newer copy than the primary (as after the primary
   * missed a write while it was away); a one-replica read returns the stale
   * copy, the default read returns the newest and repairs the primary.
   */
  @Test
  void aReplicaThatMissedAWriteIsNeverReadAlone() throws Exception {
    String nodes = System.getProperty("lightstore.nodes");
    assumeTrue(nodes != null && !nodes.isBlank(), "no -Dlightstore.nodes");
    List<String> list = List.of(nodes.split(","));
    assumeTrue(list.size() >= 2, "needs two replicas");
    byte[] key = ("{stale" + System.nanoTime() + "}k").getBytes(StandardCharsets.UTF_8);
    byte[] older = "older".getBytes(StandardCharsets.UTF_8);
    byte[] newer = "newer".getBytes(StandardCharsets.UTF_8);
    try (ClusterClient consistent = new ClusterClient(list, 2, 0, 0, 2000, null);
        ClusterClient oneReplica = new ClusterClient(list, 2, 0, 1, 2000, null)) {
      consistent.write(List.of(key), List.of(older));
      int[] replicas = consistent.replicasOf(key);
      String version = Long.toUnsignedString(ClusterClient.nextVersion());
      consistent.callNode(replicas[1], "VSET", key,
          version.getBytes(StandardCharsets.US_ASCII), newer);

      assertArrayEquals(older, oneReplica.mget(List.of(key)).get(0), "one replica: stale");
      assertArrayEquals(newer, consistent.mget(List.of(key)).get(0), "newest copy wins");
      assertEquals(1, consistent.readRepairs());
      byte[] onPrimary = (byte[]) consistent.callNode(replicas[0], "GET", key);
      assertArrayEquals(newer, Versioned.decode(onPrimary).value, "the primary was repaired");
      assertArrayEquals(newer, oneReplica.mget(List.of(key)).get(0));
    }
  }

  /**
   * The same rule for range reads (crates/client/src/range.rs): the listing's
   * digests show the primary behind, the range returns the newest copy and
   * repairs the primary; a deletion one replica missed stays deleted.
   */
  @Test
  void aRangeReadsTheNewestCopyAndRepairs() throws Exception {
    String nodes = System.getProperty("lightstore.nodes");
    assumeTrue(nodes != null && !nodes.isBlank(), "no -Dlightstore.nodes");
    List<String> list = List.of(nodes.split(","));
    assumeTrue(list.size() >= 2, "needs two replicas");
    String prefix = "rangestale" + System.nanoTime() + "/";
    byte[] newer = (prefix + "a").getBytes(StandardCharsets.UTF_8);
    byte[] gone = (prefix + "b").getBytes(StandardCharsets.UTF_8);
    byte[] old = "old".getBytes(StandardCharsets.UTF_8);
    try (ClusterClient c = new ClusterClient(list, 2, 0, 0, 2000, null)) {
      c.write(List.of(newer), List.of(old));
      c.write(List.of(gone), List.of(old));
      byte[] version = Long.toUnsignedString(ClusterClient.nextVersion())
          .getBytes(StandardCharsets.US_ASCII);
      c.callNode(c.replicasOf(newer)[1], "VSET", newer, version, "new".getBytes(StandardCharsets.UTF_8));
      c.callNode(c.replicasOf(gone)[1], "VDEL", gone, version);
      List<byte[][]> got = c.range(prefix.getBytes(StandardCharsets.UTF_8),
          (prefix + "z").getBytes(StandardCharsets.UTF_8), 10);
      assertEquals(1, got.size(), "the deleted key stays deleted");
      assertArrayEquals(newer, got.get(0)[0]);
      assertArrayEquals("new".getBytes(StandardCharsets.UTF_8), got.get(0)[1]);
      assertEquals(2, c.readRepairs(), "both primaries repaired");
      byte[] onPrimary = (byte[]) c.callNode(c.replicasOf(newer)[0], "GET", newer);
      assertArrayEquals("new".getBytes(StandardCharsets.UTF_8), Versioned.decode(onPrimary).value);
      byte[] tomb = (byte[]) c.callNode(c.replicasOf(gone)[0], "GET", gone);
      assertEquals(null, Versioned.decode(tomb).value, "the primary holds the tombstone");
    }
  }
}
