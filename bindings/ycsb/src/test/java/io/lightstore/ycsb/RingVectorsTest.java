package io.lightstore.ycsb;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The Java ring against the vectors the Rust client produced. */
class RingVectorsTest {
  private static final Path VECTORS = Path.of("..", "..", "testdata", "ring-vectors.tsv");

  @Test
  void ringMatchesTheSharedVectors() throws Exception {
    HexFormat hex = HexFormat.of();
    Ring ring = null;
    int replicas = 0;
    int checked = 0;
    for (String line : Files.readAllLines(VECTORS, StandardCharsets.UTF_8)) {
      if (line.isEmpty() || line.startsWith("#")) {
        continue;
      }
      String[] f = line.split("\t", -1);
      if (f[0].equals("cluster")) {
        replicas = Integer.parseInt(f[1]);
        ring = new Ring(Arrays.asList(f[2].split(",")));
        continue;
      }
      byte[] key = hex.parseHex(f[0]);
      assertEquals(f[1], String.format("%016x", Ring.keyHash(key)), "hash of " + f[0]);
      int[] want = Arrays.stream(f[2].split(",")).mapToInt(Integer::parseInt).toArray();
      assertArrayEquals(want, ring.replicas(key, replicas), "replicas of " + f[0]);
      checked++;
    }
    assertTrue(checked >= 300, "only " + checked + " vectors");
  }

  @Test
  void hashTagsFollowRedisCluster() {
    String[][] cases = {
        {"user1000", "user1000"}, {"{user1000}.following", "user1000"},
        {"foo{}{bar}", "foo{}{bar}"}, {"foo{{bar}}zap", "{bar"}, {"foo{bar}{zap}", "bar"},
        {"{", "{"}, {"a}b{c", "a}b{c"},
    };
    for (String[] c : cases) {
      assertEquals(c[1], new String(Ring.placement(c[0].getBytes(StandardCharsets.UTF_8)),
          StandardCharsets.UTF_8), c[0]);
    }
  }

  @Test
  void versionedLayoutMatchesTheNodes() {
    byte[] enc = Versioned.encodeValue(0x0102030405060708L, "ab".getBytes(StandardCharsets.UTF_8));
    assertArrayEquals(HexFormat.of().parseHex("f1010102030405060708" + "6162"), enc);
    Versioned v = Versioned.decode(enc);
    assertEquals(0x0102030405060708L, v.version);
    assertArrayEquals("ab".getBytes(StandardCharsets.UTF_8), v.value);
    Versioned tomb = Versioned.decode(HexFormat.of().parseHex("f1020000000000000009"));
    assertEquals(9, tomb.version);
    assertNull(tomb.value);
    Versioned plain = Versioned.decode("plain".getBytes(StandardCharsets.UTF_8));
    assertEquals(0, plain.version);
  }
}
