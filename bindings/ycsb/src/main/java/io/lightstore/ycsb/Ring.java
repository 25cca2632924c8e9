package io.lightstore.ycsb;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import net.openhft.hashing.LongHashFunction;

/**
 * Key placement, exactly as the Rust cluster client does it
 * (crates/client/src/ring.rs): consistent hashing with {@link #VNODES} points
 * per node, point i of a node at xxh64(id + "#" + i, seed 0), points sorted by
 * unsigned value then node id, a key's replicas found by walking the ring from
 * the first point at or after xxh64(placement part) and taking distinct nodes.
 * The shared vectors in testdata/ring-vectors.tsv hold both to it.
 */
public final class Ring {
  /** Points per node on the ring. */
  public static final int VNODES = 160;

  private static final LongHashFunction XXH64 = LongHashFunction.xx(0);

  private final long[] points;
  private final int[] owners;
  private final int nodes;

  /** The ring of the nodes with these ids (distinct). */
  public Ring(List<String> ids) {
    int n = ids.size() * VNODES;
    long[][] pts = new long[n][];
    int k = 0;
    for (int node = 0; node < ids.size(); node++) {
      for (int i = 0; i < VNODES; i++) {
        byte[] label = (ids.get(node) + "#" + i).getBytes(StandardCharsets.UTF_8);
        pts[k++] = new long[] {XXH64.hashBytes(label), node};
      }
    }
    Arrays.sort(pts, (a, b) -> {
      int c = Long.compareUnsigned(a[0], b[0]);
      return c != 0 ? c : compareUtf8(ids.get((int) a[1]), ids.get((int) b[1]));
    });
    points = new long[n];
    owners = new int[n];
    for (int i = 0; i < n; i++) {
      points[i] = pts[i][0];
      owners[i] = (int) pts[i][1];
    }
    nodes = ids.size();
  }

  private static int compareUtf8(String a, String b) {
    return Arrays.compareUnsigned(a.getBytes(StandardCharsets.UTF_8), b.getBytes(StandardCharsets.UTF_8));
  }

  /**
   * The part of a key that decides its placement (Redis Cluster's hash tags):
   * the bytes between the first '{' and the first '}' after it when there is at
   * least one, else the whole key.
   */
  public static byte[] placement(byte[] key) {
    for (int open = 0; open < key.length; open++) {
      if (key[open] == '{') {
        for (int close = open + 1; close < key.length; close++) {
          if (key[close] == '}') {
            return close > open + 1 ? Arrays.copyOfRange(key, open + 1, close) : key;
          }
        }
        return key;
      }
    }
    return key;
  }

  /** A key's position on the ring. */
  public static long keyHash(byte[] key) {
    return XXH64.hashBytes(placement(key));
  }

  /** The {@code replicas} distinct nodes holding {@code key}, primary first. */
  public int[] replicas(byte[] key, int replicas) {
    int want = Math.min(replicas, nodes);
    if (want <= 0) {
      return new int[0];
    }
    int[] out = new int[want];
    int found = 0;
    long h = keyHash(key);
    int lo = 0;
    int hi = points.length;
    while (lo < hi) {
      int mid = (lo + hi) >>> 1;
      if (Long.compareUnsigned(points[mid], h) < 0) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    for (int k = 0; k < points.length && found < want; k++) {
      int node = owners[(lo + k) % points.length];
      if (!contains(out, found, node)) {
        out[found++] = node;
      }
    }
    return found == want ? out : Arrays.copyOf(out, found);
  }

  private static boolean contains(int[] nodes, int count, int node) {
    for (int i = 0; i < count; i++) {
      if (nodes[i] == node) {
        return true;
      }
    }
    return false;
  }
}
