package io.lightstore.ycsb;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;
import org.junit.jupiter.api.Test;

/** Write versions and the order of stored copies against the Rust client's vectors. */
class VersionVectorsTest {
  private static final Path VECTORS = Path.of("..", "..", "testdata", "version-vectors.tsv");

  @Test
  void versionsAndOrderMatchTheSharedVectors() throws Exception {
    HexFormat hex = HexFormat.of();
    int checked = 0;
    for (String line : Files.readAllLines(VECTORS, StandardCharsets.UTF_8)) {
      if (line.isEmpty() || line.startsWith("#")) {
        continue;
      }
      String[] f = line.split("\t", -1);
      if (f[0].equals("next")) {
        long want = Long.parseUnsignedLong(f[4]);
        long got = Versioned.nextVersion(Long.parseUnsignedLong(f[1]),
            Long.parseUnsignedLong(f[2]), Integer.parseInt(f[3]));
        assertEquals(Long.toUnsignedString(want), Long.toUnsignedString(got), line);
      } else {
        int want = Integer.parseInt(f[3]);
        int got = Integer.signum(Versioned.compareStored(hex.parseHex(f[1]), hex.parseHex(f[2])));
        assertEquals(want, got, line);
      }
      checked++;
    }
    assertTrue(checked >= 70, "only " + checked + " vectors");
  }

  @Test
  void versionsOfThisJvmIncreaseAndCarryItsId() {
    long a = ClusterClient.nextVersion();
    long b = ClusterClient.nextVersion();
    assertTrue(Long.compareUnsigned(b, a) > 0);
    assertEquals(a & Versioned.MAX_CLIENT_ID, b & Versioned.MAX_CLIENT_ID);
  }
}
