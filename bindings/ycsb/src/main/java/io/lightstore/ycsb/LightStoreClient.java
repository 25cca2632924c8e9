package io.lightstore.ycsb;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/**
 * The YCSB binding for a LightStore cluster.
 *
 * <p>A record is one key, {@code table + "/" + record}, whose value holds all its
 * fields ({@link #encodeRecord}), as YCSB's RocksDB binding keeps them: a read is
 * one GET per replica, an insert one VSET, and a scan over records one ordered
 * range read merged across the cluster that reads one value per record. Records
 * sort by their key bytes, which is YCSB's order when record keys have equal
 * length (with {@code zeropadding}, as in the workload files here). An update
 * of some fields reads the record and writes it back whole: two clients
 * updating different fields of one record at the same moment may lose one
 * update (the newer write wins), as with YCSB's other key-value bindings.
 *
 * <p>Properties: {@code lightstore.nodes} (host:port,... required; the same
 * list, in the same form, as the Rust clients use), {@code lightstore.replicas}
 * (default 2 with at least 2 nodes), {@code lightstore.writequorum} (default:
 * every replica that is up), {@code lightstore.readquorum} (default: every
 * replica that is up, newest copy wins; 1 reads one replica, faster but
 * possibly stale), {@code lightstore.timeoutms} (2000: a node silent that
 * long is probed, and marked down unless it answers),
 * {@code lightstore.busytimeoutms} (30000: the longest a call waits on a node
 * that answers probes), {@code lightstore.password}.
 */
public class LightStoreClient extends DB {
  private ClusterClient cluster;

  @Override
  public void init() throws DBException {
    Properties p = getProperties();
    String nodes = p.getProperty("lightstore.nodes");
    if (nodes == null || nodes.isBlank()) {
      throw new DBException("set lightstore.nodes=host:port,host:port,...");
    }
    List<String> list = new ArrayList<>();
    for (String n : nodes.split(",")) {
      if (!n.isBlank()) {
        list.add(n.trim());
      }
    }
    try {
      cluster = new ClusterClient(list,
          Integer.parseInt(p.getProperty("lightstore.replicas", "0")),
          Integer.parseInt(p.getProperty("lightstore.writequorum", "0")),
          Integer.parseInt(p.getProperty("lightstore.readquorum", "0")),
          Integer.parseInt(p.getProperty("lightstore.timeoutms", "2000")),
          Integer.parseInt(p.getProperty("lightstore.busytimeoutms",
              String.valueOf(ClusterClient.DEFAULT_BUSY_TIMEOUT_MS))),
          password(p, System.getenv()));
    } catch (IllegalArgumentException e) {
      throw new DBException("bad lightstore property: " + e.getMessage());
    }
  }

  /**
   * The nodes' password: {@code lightstore.password}, else the
   * {@code LIGHTSTORE_PASSWORD} environment variable (which, unlike a
   * command-line property, other local users cannot read in {@code ps}),
   * else none. Empty counts as none. The Rust tools follow the same rule.
   */
  static String password(Properties p, java.util.Map<String, String> env) {
    String v = p.getProperty("lightstore.password");
    if (v == null || v.isEmpty()) {
      v = env.get("LIGHTSTORE_PASSWORD");
    }
    return v == null || v.isEmpty() ? null : v;
  }

  @Override
  public void cleanup() {
    if (cluster != null) {
      cluster.close();
    }
  }

  /** The key of a record: its table, '/', its YCSB key. */
  static byte[] recordKey(String table, String key) {
    return (table + "/" + key).getBytes(StandardCharsets.UTF_8);
  }

  /**
   * A record's value: for each field, its name's length (2 bytes, big-endian),
   * its name (UTF-8), its value's length (4 bytes, big-endian), its value.
   */
  static byte[] encodeRecord(Map<String, byte[]> fields) {
    int size = 0;
    List<byte[]> names = new ArrayList<>(fields.size());
    for (Map.Entry<String, byte[]> f : fields.entrySet()) {
      byte[] name = f.getKey().getBytes(StandardCharsets.UTF_8);
      if (name.length > 0xffff) {
        throw new IllegalArgumentException("field name longer than 65535 bytes");
      }
      names.add(name);
      size += 2 + name.length + 4 + f.getValue().length;
    }
    ByteBuffer out = ByteBuffer.allocate(size);
    int i = 0;
    for (byte[] value : fields.values()) {
      byte[] name = names.get(i++);
      out.putShort((short) name.length).put(name).putInt(value.length).put(value);
    }
    return out.array();
  }

  /** Receives a record's fields as {@link #decodeFields} finds them. */
  private interface FieldSink {
    /** Field {@code name}: its value is {@code len} bytes of {@code value} from {@code off}. */
    void field(String name, byte[] value, int off, int len);
  }

  /**
   * Field names seen at each position of a record, kept so that decoding a
   * record reuses them (with their cached hash codes) instead of making and
   * hashing ten new strings per record. Racy by design: a slot holds some
   * immutable string or null, and a miss only costs a new string.
   */
  private static final String[] NAMES = new String[32];

  /** The field name in {@code nameLen} bytes of {@code value} at {@code off}, the {@code i}th field. */
  private static String fieldName(byte[] value, int off, int nameLen, int i) {
    String known = i < NAMES.length ? NAMES[i] : null;
    if (known != null && sameAscii(known, value, off, nameLen)) {
      return known;
    }
    String name = new String(value, off, nameLen, StandardCharsets.UTF_8);
    if (i < NAMES.length) {
      NAMES[i] = name;
    }
    return name;
  }

  /** {@code s} is the ASCII text in {@code len} bytes of {@code b} at {@code off}. */
  private static boolean sameAscii(String s, byte[] b, int off, int len) {
    if (s.length() != len) {
      return false;
    }
    for (int j = 0; j < len; j++) {
      if (b[off + j] < 0 || s.charAt(j) != b[off + j]) {
        return false;
      }
    }
    return true;
  }

  /**
   * Hands each field of a record's value ({@link #encodeRecord}) that
   * {@code wanted} names (null: all) to {@code sink}, in stored order, without
   * copying values. Fails on bytes that are not a record.
   */
  private static void decodeFields(byte[] value, Set<String> wanted, FieldSink sink) {
    int at = 0;
    for (int i = 0; at < value.length; i++) {
      if (value.length - at < 2) {
        throw new IllegalArgumentException("record: truncated field name length");
      }
      int nameLen = ((value[at] & 0xff) << 8) | (value[at + 1] & 0xff);
      at += 2;
      if (value.length - at < nameLen + 4) {
        throw new IllegalArgumentException("record: truncated field name");
      }
      String name = fieldName(value, at, nameLen, i);
      at += nameLen;
      int len = ((value[at] & 0xff) << 24) | ((value[at + 1] & 0xff) << 16)
          | ((value[at + 2] & 0xff) << 8) | (value[at + 3] & 0xff);
      at += 4;
      if (len < 0 || value.length - at < len) {
        throw new IllegalArgumentException("record: field " + name + " runs past the value");
      }
      if (wanted == null || wanted.contains(name)) {
        sink.field(name, value, at, len);
      }
      at += len;
    }
  }

  /**
   * The fields of a record's value ({@link #encodeRecord}) that {@code wanted}
   * names (null: all), in stored order. Fails on bytes that are not a record.
   */
  static LinkedHashMap<String, byte[]> decodeRecord(byte[] value, Set<String> wanted) {
    LinkedHashMap<String, byte[]> out = new LinkedHashMap<>();
    decodeFields(value, wanted, (name, b, off, len) -> out.put(name, Arrays.copyOfRange(b, off, off + len)));
    return out;
  }

  /** A record as YCSB takes it: its fields over the value's bytes, not copies. */
  static HashMap<String, ByteIterator> row(byte[] value, Set<String> fields) {
    HashMap<String, ByteIterator> row = new HashMap<>();
    decodeFields(value, fields, (name, b, off, len) -> row.put(name, new ByteArrayByteIterator(b, off, len)));
    return row;
  }

  /** The stored record, or null when it does not exist. */
  private byte[] get(String table, String key) throws ClusterClient.ClusterException {
    return cluster.mget(List.of(recordKey(table, key))).get(0);
  }

  @Override
  public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    try {
      byte[] value = get(table, key);
      if (value == null) {
        return Status.NOT_FOUND;
      }
      result.putAll(row(value, fields));
      return Status.OK;
    } catch (ClusterClient.ClusterException | IllegalArgumentException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
      Vector<HashMap<String, ByteIterator>> result) {
    // The table's records: from its key for startkey to just before table + '0'
    // ('/' + 1), the first key past every table + '/' + ...
    byte[] start = recordKey(table, startkey);
    byte[] end = (table + "0").getBytes(StandardCharsets.UTF_8);
    try {
      for (byte[][] kv : cluster.range(start, end, Math.max(0, recordcount))) {
        result.add(row(kv[1], fields));
      }
      return Status.OK;
    } catch (ClusterClient.ClusterException | IllegalArgumentException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    try {
      byte[] current = get(table, key);
      if (current == null) {
        return Status.NOT_FOUND;
      }
      LinkedHashMap<String, byte[]> fields = decodeRecord(current, null);
      values.forEach((k, v) -> fields.put(k, v.toArray()));
      return write(table, key, fields);
    } catch (ClusterClient.ClusterException | IllegalArgumentException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    LinkedHashMap<String, byte[]> fields = new LinkedHashMap<>();
    values.forEach((k, v) -> fields.put(k, v.toArray()));
    return write(table, key, fields);
  }

  private Status write(String table, String key, Map<String, byte[]> fields) {
    try {
      cluster.write(List.of(recordKey(table, key)), List.of(encodeRecord(fields)));
      return Status.OK;
    } catch (ClusterClient.ClusterException | IllegalArgumentException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      cluster.write(List.of(recordKey(table, key)), Collections.singletonList(null));
      return Status.OK;
    } catch (ClusterClient.ClusterException e) {
      return Status.ERROR;
    }
  }
}
