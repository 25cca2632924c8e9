package io.lightstore.ycsb;

import java.nio.ByteBuffer;
import java.util.Arrays;

/**
 * The versioned-value layout nodes store for the cluster client
 * (crates/protocol/src/versioned.rs): 0xF1, kind (1 value, 2 tombstone),
 * version as unsigned 64-bit big-endian, then the payload. Bytes without the
 * header are a plain value at version 0.
 */
public final class Versioned {
  static final int HEADER_LEN = 10;
  private static final byte MAGIC = (byte) 0xF1;

  /** The writer's version; compared unsigned. */
  public final long version;
  /** The value, or null for a deletion. */
  public final byte[] value;

  Versioned(long version, byte[] value) {
    this.version = version;
    this.value = value;
  }

  /** Decodes a stored value. */
  public static Versioned decode(byte[] stored) {
    if (stored.length >= HEADER_LEN && stored[0] == MAGIC) {
      long v = ByteBuffer.wrap(stored, 2, 8).getLong();
      if (stored[1] == 1) {
        return new Versioned(v, Arrays.copyOfRange(stored, HEADER_LEN, stored.length));
      }
      if (stored[1] == 2 && stored.length == HEADER_LEN) {
        return new Versioned(v, null);
      }
    }
    return new Versioned(0, stored);
  }

  /** Bits of a version that hold the client id (crates/client/src/version.rs). */
  static final int CLIENT_ID_BITS = 12;
  /** Largest client id. */
  static final int MAX_CLIENT_ID = (1 << CLIENT_ID_BITS) - 1;

  /**
   * The version to write after {@code last} (this client's previous one, 0 for
   * none) at {@code nowMicros}, for {@code clientId}: the time in microseconds
   * shifted left by 12 with the id in the low bits, or the next time step when
   * that would not exceed {@code last}; unsigned, saturating at 2^64-1. Same
   * numbers as the Rust client, proven by testdata/version-vectors.tsv.
   */
  static long nextVersion(long last, long nowMicros, int clientId) {
    long id = clientId & MAX_CLIENT_ID;
    long now = at(nowMicros, id);
    if (Long.compareUnsigned(now, last) > 0) {
      return now;
    }
    return at((last >>> CLIENT_ID_BITS) + 1, id);
  }

  private static long at(long micros, long id) {
    if (Long.compareUnsigned(micros, -1L >>> CLIENT_ID_BITS) > 0) {
      return -1L;
    }
    return (micros << CLIENT_ID_BITS) | id;
  }

  /**
   * The total order of stored copies of one key: by version (unsigned), then by
   * their bytes (unsigned, lexicographic), so every replica and reader picks
   * the same winner even when two writers chose one version. Negative, zero or
   * positive as {@code a} is older than, the same as, or newer than {@code b}.
   */
  static int compareStored(byte[] a, byte[] b) {
    int c = Long.compareUnsigned(decode(a).version, decode(b).version);
    return c != 0 ? c : Arrays.compareUnsigned(a, b);
  }

  /** Encodes a deletion's tombstone at a version. */
  public static byte[] encodeTombstone(long version) {
    return ByteBuffer.allocate(HEADER_LEN).put(MAGIC).put((byte) 2).putLong(version).array();
  }

  /** Encodes a value at a version. */
  public static byte[] encodeValue(long version, byte[] value) {
    return ByteBuffer.allocate(HEADER_LEN + value.length)
        .put(MAGIC).put((byte) 1).putLong(version).put(value).array();
  }
}
