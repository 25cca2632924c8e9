package io.lightstore.ycsb;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.Test;

/** The binding's record layout: one key per record, every field in its value. */
class RecordTest {
  private static byte[] utf8(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  @Test
  void aRecordEncodesToFixedBytesAndBack() {
    LinkedHashMap<String, byte[]> fields = new LinkedHashMap<>();
    fields.put("f0", utf8("ab"));
    fields.put("field1", new byte[0]);
    byte[] enc = LightStoreClient.encodeRecord(fields);
    assertArrayEquals(HexFormat.of().parseHex(
        "0002" + "6630" + "00000002" + "6162" + "0006" + "6669656c6431" + "00000000"), enc);
    Map<String, byte[]> back = LightStoreClient.decodeRecord(enc, null);
    assertEquals(fields.keySet(), back.keySet());
    assertArrayEquals(utf8("ab"), back.get("f0"));
    assertArrayEquals(new byte[0], back.get("field1"));
    assertEquals(Set.of("field1"), LightStoreClient.decodeRecord(enc, Set.of("field1", "x")).keySet());
    assertTrue(LightStoreClient.decodeRecord(new byte[0], null).isEmpty());
  }

  @Test
  void aRowReadsTheValueInPlaceWhateverNamesCameBefore() {
    // Two records with different names at the same positions, one of them
    // not ASCII: each row has its own names and its own values.
    LinkedHashMap<String, byte[]> first = new LinkedHashMap<>();
    first.put("field0", utf8("one"));
    first.put("field1", utf8("two"));
    LinkedHashMap<String, byte[]> second = new LinkedHashMap<>();
    second.put("fieldX", utf8("three"));
    second.put("f\u00e9ld1", new byte[0]);
    for (int round = 0; round < 2; round++) {
      for (LinkedHashMap<String, byte[]> rec : java.util.List.of(first, second)) {
        Map<String, site.ycsb.ByteIterator> row = LightStoreClient.row(LightStoreClient.encodeRecord(rec), null);
        assertEquals(rec.keySet(), row.keySet());
        for (Map.Entry<String, byte[]> f : rec.entrySet()) {
          assertArrayEquals(f.getValue(), row.get(f.getKey()).toArray(), f.getKey());
        }
      }
    }
    Map<String, site.ycsb.ByteIterator> some =
        LightStoreClient.row(LightStoreClient.encodeRecord(first), Set.of("field1"));
    assertEquals(Set.of("field1"), some.keySet());
    assertEquals("two", some.get("field1").toString());
  }

  @Test
  void bytesThatAreNotARecordAreRefused() {
    byte[] enc = LightStoreClient.encodeRecord(Map.of("field0", utf8("value")));
    for (int cut = 1; cut < enc.length; cut++) {
      byte[] part = Arrays.copyOf(enc, cut);
      assertThrows(IllegalArgumentException.class, () -> LightStoreClient.decodeRecord(part, null),
          "cut at " + cut);
    }
    byte[] negative = HexFormat.of().parseHex("0001" + "61" + "ffffffff");
    assertThrows(IllegalArgumentException.class, () -> LightStoreClient.decodeRecord(negative, null));
  }

  @Test
  void recordKeysSortInYcsbOrderWithinTheirTable() {
    byte[] a = LightStoreClient.recordKey("usertable", "user0000000000000000000000000042");
    byte[] b = LightStoreClient.recordKey("usertable", "user0000000000000000000000000043");
    assertEquals("usertable/user0000000000000000000000000042", new String(a, StandardCharsets.UTF_8));
    assertTrue(Arrays.compareUnsigned(a, b) < 0);
    // A scan's end bound, table + '0', lies past every key of the table and
    // before the next table's keys.
    byte[] end = utf8("usertable0");
    assertTrue(Arrays.compareUnsigned(utf8("usertable/\uffff"), end) < 0);
    assertTrue(Arrays.compareUnsigned(end, utf8("usertable2/a")) < 0);
  }
}
