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

  /** Encodes a value at a version. */
  public static byte[] encodeValue(long version, byte[] value) {
    return ByteBuffer.allocate(HEADER_LEN + value.length)
        .put(MAGIC).put((byte) 1).putLong(version).put(value).array();
  }
}
