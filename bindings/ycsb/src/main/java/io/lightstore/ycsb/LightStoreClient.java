package io.lightstore.ycsb;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
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
 * <p>Each field of a record is its own key, {@code "{" + record + "}" + 0x00 +
 * field}: the hash tag places every field of a record on the record's
 * replicas, so a record is written with one VSET and read with one MGET per
 * replica, and the fields of a record are contiguous in key order, so a scan
 * over records is one ordered range read merged across the cluster. Records
 * sort by their key bytes when record keys have equal length (YCSB's with
 * {@code zeropadding}, as in the workload files here). Records of a table
 * other than {@code usertable} are kept apart by a {@code table/} prefix.
 *
 * <p>Properties: {@code lightstore.nodes} (host:port,... required; the same
 * list, in the same form, as the Rust clients use), {@code lightstore.replicas}
 * (default 2 with at least 2 nodes), {@code lightstore.writequorum} (default:
 * every replica that is up), {@code lightstore.readquorum} (default: every
 * replica that is up, newest copy wins; 1 reads one replica, faster but
 * possibly stale), {@code lightstore.timeoutms} (2000),
 * {@code lightstore.password}; YCSB's {@code fieldcount} and
 * {@code fieldnameprefix} name the fields read by a read of all fields.
 */
public class LightStoreClient extends DB {
  private ClusterClient cluster;
  private List<String> allFields;

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
          password(p, System.getenv()));
    } catch (IllegalArgumentException e) {
      throw new DBException("bad lightstore property: " + e.getMessage());
    }
    int fieldCount = Integer.parseInt(p.getProperty("fieldcount", "10"));
    String prefix = p.getProperty("fieldnameprefix", "field");
    allFields = new ArrayList<>(fieldCount);
    for (int i = 0; i < fieldCount; i++) {
      allFields.add(prefix + i);
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

  /** The record part of a field key: the record key, table-qualified. */
  static String recordId(String table, String key) {
    return "usertable".equals(table) ? key : table + "/" + key;
  }

  /** The key of one field of a record. */
  static byte[] fieldKey(String table, String key, String field) {
    return ("{" + recordId(table, key) + "}\u0000" + field).getBytes(StandardCharsets.UTF_8);
  }

  @Override
  public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    List<String> names = fields == null ? allFields : new ArrayList<>(fields);
    List<byte[]> keys = new ArrayList<>(names.size());
    for (String f : names) {
      keys.add(fieldKey(table, key, f));
    }
    try {
      List<byte[]> values = cluster.mget(keys);
      boolean any = false;
      for (int i = 0; i < names.size(); i++) {
        if (values.get(i) != null) {
          result.put(names.get(i), new ByteArrayByteIterator(values.get(i)));
          any = true;
        }
      }
      return any ? Status.OK : Status.NOT_FOUND;
    } catch (ClusterClient.ClusterException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
      Vector<HashMap<String, ByteIterator>> result) {
    byte[] start = ("{" + recordId(table, startkey) + "}").getBytes(StandardCharsets.UTF_8);
    int page = Math.max(1, recordcount) * Math.max(1, allFields.size());
    LinkedHashMap<String, HashMap<String, ByteIterator>> records = new LinkedHashMap<>();
    try {
      while (true) {
        List<byte[][]> pairs = cluster.range(start, new byte[0], page);
        for (byte[][] kv : pairs) {
          String k = new String(kv[0], StandardCharsets.UTF_8);
          int sep = k.indexOf("}\u0000");
          if (!k.startsWith("{") || sep < 0) {
            continue;
          }
          String record = k.substring(1, sep);
          String field = k.substring(sep + 2);
          if (!records.containsKey(record) && records.size() == recordcount) {
            result.addAll(records.values());
            return Status.OK;
          }
          HashMap<String, ByteIterator> row = records.computeIfAbsent(record, r -> new HashMap<>());
          if (fields == null || fields.contains(field)) {
            row.put(field, new ByteArrayByteIterator(kv[1]));
          }
        }
        if (pairs.size() < page) {
          break;
        }
        byte[] last = pairs.get(pairs.size() - 1)[0];
        start = Arrays.copyOf(last, last.length + 1);
      }
      result.addAll(records.values());
      return Status.OK;
    } catch (ClusterClient.ClusterException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    return write(table, key, values);
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    return write(table, key, values);
  }

  private Status write(String table, String key, Map<String, ByteIterator> values) {
    List<byte[]> keys = new ArrayList<>(values.size());
    List<byte[]> vals = new ArrayList<>(values.size());
    for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
      keys.add(fieldKey(table, key, e.getKey()));
      vals.add(e.getValue().toArray());
    }
    try {
      cluster.write(keys, vals);
      return Status.OK;
    } catch (ClusterClient.ClusterException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    List<byte[]> keys = new ArrayList<>(allFields.size());
    List<byte[]> vals = new ArrayList<>(allFields.size());
    for (String f : allFields) {
      keys.add(fieldKey(table, key, f));
      vals.add(null);
    }
    try {
      cluster.write(keys, vals);
      return Status.OK;
    } catch (ClusterClient.ClusterException e) {
      return Status.ERROR;
    }
  }
}
